//! Snapshots and backups (issue 13): the snapshot file format (`snapshot`), taking and
//! restoring one, and pushing it to S3.

pub mod snapshot;
