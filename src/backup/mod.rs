//! Backups: where snapshot files go when they leave the host.
//!
//! Owns the S3 client (`s3`). The snapshot format and the `svc-backup` CLI build on it.

pub mod s3;
