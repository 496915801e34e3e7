//! `svc-backup create|list|restore|verify`: the snapshot of `svc-cluster-backup` kept in an
//! S3-compatible object store (`backup::s3`). `create` streams a snapshot from the server
//! into a temp file, uploads it (multipart when large) and prunes to `--keep`; `restore` and
//! `verify` download into a temp file and run the local logic (`backup::local`). Temp files
//! go to $TMPDIR and are removed afterwards. S3 credentials are never printed or logged.

use std::path::PathBuf;

use argh::FromArgs;

use super::cluster::{default_name, download, passphrase, print_verified};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::backup::local;
use crate::backup::s3::{S3Client, S3Config, S3Flags};
use crate::config::Secret;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-backup's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("create", CreateArgs, create),
    command!("list", ListArgs, list),
    command!("restore", RestoreArgs, restore),
    command!("verify", VerifyArgs, verify),
];

/// The object store flags every command takes, and the client they make.
macro_rules! s3_args {
    ($(#[$meta:meta])* struct $name:ident { $($field:tt)* }) => {
        $(#[$meta])*
        struct $name {
            /// the bucket (env SVC_BACKUP_BUCKET)
            #[argh(option)]
            bucket: Option<String>,
            /// key prefix (default svc-backups/)
            #[argh(option, default = "String::from(\"svc-backups/\")")]
            prefix: String,
            /// S3 access key (default env AWS_ACCESS_KEY_ID)
            #[argh(option)]
            s3_access_key: Option<String>,
            /// S3 secret key (default env AWS_SECRET_ACCESS_KEY)
            #[argh(option)]
            s3_secret_key: Option<String>,
            /// S3 endpoint URL (default env AWS_ENDPOINT_URL, else AWS)
            #[argh(option)]
            s3_endpoint: Option<String>,
            /// S3 region (default env AWS_REGION, else us-east-1)
            #[argh(option)]
            s3_region: Option<String>,
            /// use TLS to the endpoint (default true)
            #[argh(option)]
            s3_ssl: Option<bool>,
            $($field)*
        }

        impl $name {
            fn client(&self) -> Result<(S3Client, String), CliError> {
                let config = S3Config::from_env_and_flags(S3Flags {
                    endpoint: self.s3_endpoint.clone(),
                    region: self.s3_region.clone(),
                    access_key: self.s3_access_key.clone().map(Secret),
                    secret_key: self.s3_secret_key.clone().map(Secret),
                    ssl: self.s3_ssl,
                    ..S3Flags::default()
                })?;
                let bucket = self
                    .bucket
                    .clone()
                    .or_else(|| std::env::var("SVC_BACKUP_BUCKET").ok().filter(|b| !b.is_empty()))
                    .ok_or_else(|| CliError::usage("give --bucket B or set SVC_BACKUP_BUCKET"))?;
                Ok((S3Client::new(config)?, bucket))
            }
        }
    };
}

s3_args! {
    #[derive(FromArgs, argh::ArgsInfo)]
    /// Take a snapshot through the server (admin key) and upload it as PREFIX + its name;
    /// then delete the oldest snapshots under PREFIX beyond --keep. Scheduled backups are
    /// deferred (not built): run create from cron or a systemd timer.
    #[argh(help_triggers("-h", "--help"))]
    struct CreateArgs {
        /// keep this many snapshots under the prefix (default: keep all)
        #[argh(option)]
        keep: Option<usize>,
        /// encrypt with the passphrase from --passphrase-file or env SVC_BACKUP_PASSPHRASE
        #[argh(switch)]
        encrypt: bool,
        /// file holding the passphrase (its first line)
        #[argh(option)]
        passphrase_file: Option<PathBuf>,
    }
}

s3_args! {
    #[derive(FromArgs, argh::ArgsInfo)]
    /// List the snapshots under the prefix: key, size, last modified.
    #[argh(help_triggers("-h", "--help"))]
    struct ListArgs {}
}

s3_args! {
    #[derive(FromArgs, argh::ArgsInfo)]
    /// Download a snapshot and restore it offline (as svc-cluster-backup restore).
    #[argh(help_triggers("-h", "--help"))]
    struct RestoreArgs {
        /// the object key
        #[argh(option)]
        key: String,
        /// replace a populated target
        #[argh(switch)]
        force: bool,
        /// the server configuration (default /etc/svc/server.yaml)
        #[argh(option)]
        config: Option<PathBuf>,
        /// file holding the passphrase of an encrypted snapshot (else SVC_BACKUP_PASSPHRASE)
        #[argh(option)]
        passphrase_file: Option<PathBuf>,
    }
}

s3_args! {
    #[derive(FromArgs, argh::ArgsInfo)]
    /// Download a snapshot and check it completely (as svc-cluster-backup verify).
    #[argh(help_triggers("-h", "--help"))]
    struct VerifyArgs {
        /// the object key
        #[argh(option)]
        key: String,
        /// file holding the passphrase of an encrypted snapshot (else SVC_BACKUP_PASSPHRASE)
        #[argh(option)]
        passphrase_file: Option<PathBuf>,
    }
}

/// A file in $TMPDIR removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(std::env::temp_dir().join(format!("svc-backup-{}-{name}", crate::ids::ulid())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn create(common: Common, args: CreateArgs) -> Result<(), CliError> {
    let (client, bucket) = args.client()?;
    let passphrase = if args.encrypt {
        Some(passphrase(&args.passphrase_file)?.ok_or_else(|| {
            CliError::usage("--encrypt needs --passphrase-file FILE or SVC_BACKUP_PASSPHRASE")
        })?)
    } else {
        None
    };
    let name = default_name(passphrase.is_some());
    let name = name.display().to_string();
    let scratch = Scratch::new(&name);
    let bytes = download(&common, &scratch.0, passphrase.as_deref()).await?;
    let key = format!("{}{name}", args.prefix);
    client.put_object(&bucket, &key, &scratch.0, None).await?;
    drop(scratch);
    let mut pruned = Vec::new();
    if let Some(keep) = args.keep {
        let mut snapshots = snapshot_objects(&client, &bucket, &args.prefix).await?;
        // Names carry their time (svc-snapshot-YYYYMMDDTHHMMSSZ), so key order is age order.
        crate::sort::sort_by(&mut snapshots, |a, b| a.key.cmp(&b.key));
        let excess = snapshots.len().saturating_sub(keep.max(1));
        for object in snapshots.into_iter().take(excess) {
            client.delete_object(&bucket, &object.key).await?;
            pruned.push(object.key);
        }
    }
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "bucket": bucket, "key": key, "bytes": bytes,
            "encrypted": passphrase.is_some(), "pruned": pruned,
        }));
    }
    println!("uploaded s3://{bucket}/{key} ({bytes} bytes)");
    for key in pruned {
        println!("pruned s3://{bucket}/{key}");
    }
    Ok(())
}

async fn snapshot_objects(
    client: &S3Client,
    bucket: &str,
    prefix: &str,
) -> Result<Vec<crate::backup::s3::ObjectInfo>, CliError> {
    Ok(client
        .list_objects(bucket, prefix)
        .await?
        .into_iter()
        .filter(|object| local::is_snapshot_name(std::path::Path::new(&object.key)))
        .collect())
}

async fn list(common: Common, args: ListArgs) -> Result<(), CliError> {
    let (client, bucket) = args.client()?;
    let objects = snapshot_objects(&client, &bucket, &args.prefix).await?;
    if common.output == Output::Json {
        let items: Vec<serde_json::Value> = objects
            .iter()
            .map(|o| {
                serde_json::json!({
                    "key": o.key, "size": o.size,
                    "last_modified": crate::clock::format_rfc3339(o.last_modified),
                })
            })
            .collect();
        return print_json(&items);
    }
    let rows: Vec<Vec<String>> = objects
        .iter()
        .map(|o| {
            vec![
                o.key.clone(),
                o.size.to_string(),
                crate::clock::format_rfc3339(o.last_modified),
            ]
        })
        .collect();
    print_table(&["KEY", "SIZE", "LAST_MODIFIED"], &rows);
    Ok(())
}

async fn fetch(client: &S3Client, bucket: &str, key: &str) -> Result<Scratch, CliError> {
    let name = key.rsplit('/').next().unwrap_or("snapshot");
    let scratch = Scratch::new(name);
    client.get_object(bucket, key, &scratch.0, None).await?;
    Ok(scratch)
}

/// `--key` as given when it has a `/`, else under `--prefix` (as `list` shows names).
fn object_key(prefix: &str, key: &str) -> String {
    if key.contains('/') {
        key.to_string()
    } else {
        format!("{prefix}{key}")
    }
}

async fn verify(common: Common, mut args: VerifyArgs) -> Result<(), CliError> {
    let (client, bucket) = args.client()?;
    args.key = object_key(&args.prefix, &args.key);
    let passphrase = passphrase(&args.passphrase_file)?;
    let scratch = fetch(&client, &bucket, &args.key).await?;
    let verified = local::verify(&scratch.0, passphrase.as_deref())
        .await
        .map_err(|error| CliError::failed(format!("{}: invalid: {error}", args.key)))?;
    print_verified(&common, std::path::Path::new(&args.key), &verified)
}

async fn restore(common: Common, mut args: RestoreArgs) -> Result<(), CliError> {
    let (client, bucket) = args.client()?;
    args.key = object_key(&args.prefix, &args.key);
    let passphrase = passphrase(&args.passphrase_file)?;
    let loaded = crate::config::load_server(args.config.as_deref(), &crate::config::process_env())
        .map_err(|e| CliError::failed(format!("configuration: {e}")))?;
    let scratch = fetch(&client, &bucket, &args.key).await?;
    let options = local::RestoreOptions {
        input: &scratch.0,
        passphrase: passphrase.as_deref(),
        force: args.force,
    };
    let systemd = local::Systemd {
        unit: "svc-server".into(),
    };
    let restored = local::restore(&loaded.config, &options, &systemd).await?;
    if common.output == Output::Json {
        return print_json(&restored);
    }
    println!(
        "restored s3://{bucket}/{} into {}: {} audit rows verified{}",
        args.key,
        restored.data_dir,
        restored.audit_rows,
        if restored.restarted_server {
            "; svc-server stopped and started again"
        } else {
            ""
        }
    );
    Ok(())
}
