//! PostgreSQL for tests: a throwaway cluster on 127.0.0.1 (initdb/pg_ctl in a temp dir), or
//! the server `SVC_TEST_PG_URL` names, and a fresh database per test or server.
//!
//! postgres refuses to run as root, so when the tests run as root (CI) the cluster runs as
//! `nobody` through `runuser`. Missing PostgreSQL binaries skip the caller (None, with a
//! "skipped" line) only outside CI; under CI they are a failure, since `.ci/run` installs them.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// An admin URL (a role that may CREATE DATABASE and CREATE ROLE) of an existing server to
/// use instead of starting a cluster. The tests' databases (`svc_test_<pid>_...`) and lease
/// roles are left on it for inspection; drop them when done.
pub const URL_VAR: &str = "SVC_TEST_PG_URL";

const PASSWORD: &str = "admin-pw";

/// A PostgreSQL server the tests may use as admin.
pub struct Postgres {
    /// `user:password@host:port`, as URLs spell it.
    authority: String,
    host: String,
    port: u16,
    /// The database admin connections use (`postgres` on our own cluster).
    admin_db: String,
    /// `?...` of the given URL, carried into every URL made from it.
    query: String,
    /// Our own cluster; None for a server named by SVC_TEST_PG_URL.
    cluster: Option<Box<Cluster>>,
}

/// A cluster this process started. Its watchdog stops it and removes its directory once the
/// write end of the watchdog's stdin closes, which happens when this process exits however it
/// exits (statics are never dropped, and a killed test runs no destructor), or on drop.
struct Cluster {
    dir: PathBuf,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
    /// What [`Postgres::kill`] and [`Postgres::start_again`] need: the binaries' directory,
    /// the data directory, the server options and whether it runs as `nobody`.
    bin: PathBuf,
    data: PathBuf,
    options: String,
    as_nobody: bool,
}

/// The one server of this test process: started on first use, stopped when the process
/// exits. None (after printing why) when PostgreSQL is not installed and CI is not set.
pub fn shared() -> Option<&'static Postgres> {
    static SHARED: OnceLock<Option<Postgres>> = OnceLock::new();
    SHARED
        .get_or_init(|| match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => Some(Postgres::external(&url)),
            _ => Postgres::start(),
        })
        .as_ref()
}

/// What a benchmark measures on: the cluster `SVC_TEST_PG_URL` names, or else a durable one of
/// its own (stopped when this is dropped).
pub enum BenchPostgres {
    Shared(&'static Postgres),
    Own(Postgres),
}

impl std::ops::Deref for BenchPostgres {
    type Target = Postgres;
    fn deref(&self) -> &Postgres {
        match self {
            BenchPostgres::Shared(shared) => shared,
            BenchPostgres::Own(own) => own,
        }
    }
}

/// The PostgreSQL a benchmark runs on (see [`BenchPostgres`]); None (after printing why) when
/// none can be had and CI is not set.
pub fn for_bench() -> Option<BenchPostgres> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => shared().map(BenchPostgres::Shared),
        _ => Postgres::start_durable().map(BenchPostgres::Own),
    }
}

impl Postgres {
    /// Starts a private cluster, stopped on drop (or when the process exits). None (after
    /// printing why) when PostgreSQL is not installed and CI is not set.
    pub fn start() -> Option<Postgres> {
        Self::start_with("-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
    }

    /// A private cluster with PostgreSQL's own durability defaults (fsync, synchronous commit,
    /// full-page writes), for benchmarks that compare it with a store that syncs its commits.
    pub fn start_durable() -> Option<Postgres> {
        Self::start_with("")
    }

    /// A private cluster that can be killed and started again ([`Postgres::kill`],
    /// [`Postgres::start_again`]) without losing a commit it acknowledged: fsync is off (the
    /// operating system does not crash in a test) but commits are synchronous, so each one is
    /// written out of PostgreSQL's memory before the client hears of it.
    pub fn start_restartable() -> Option<Postgres> {
        Self::start_with("-c fsync=off -c full_page_writes=off")
    }

    fn start_with(durability: &str) -> Option<Postgres> {
        let Some(bin) = find_postgres() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL binaries (initdb, pg_ctl) not found; .ci/run installs them"
            );
            eprintln!(
                "skipped: no initdb (PostgreSQL binaries not found; apt-get install postgresql)"
            );
            return None;
        };
        // The directory outlives this process's destructors: the watchdog removes it.
        let dir = tempfile::tempdir().unwrap().keep();
        // postgres refuses root; `nobody` then owns the cluster and runs every tool on it.
        let as_nobody = unsafe { libc::geteuid() } == 0;
        let pwfile = dir.join("pw");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        if as_nobody {
            let status = Command::new("chown")
                .arg("-R")
                .arg("nobody")
                .arg(&dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown -R nobody {}", dir.display());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.join("data");
        // A command run as the cluster's owner.
        let as_owner = |program: &Path| -> Command {
            let mut command = if as_nobody {
                let mut c = Command::new("runuser");
                c.args(["-u", "nobody", "--"]).arg(program);
                c
            } else {
                Command::new(program)
            };
            command.current_dir(&dir);
            command
        };
        let tool = |name: &str| as_owner(&bin.join(name));
        // The watchdog first, so that even a failed start leaves nothing behind.
        let mut watchdog = as_owner(Path::new("/bin/sh"));
        let watchdog = watchdog
            .args(["-c", WATCHDOG])
            .arg(bin.join("pg_ctl"))
            .arg(&data)
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group: a Ctrl-C that ends the tests must not end it first.
        std::os::unix::process::CommandExt::process_group(watchdog, 0);
        let mut watchdog = watchdog.spawn().expect("watchdog starts");
        let stdin = watchdog.stdin.take().unwrap();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 {durability} -c max_connections=300",
            dir.display()
        );
        let cluster = Cluster {
            dir: dir.clone(),
            watchdog: Mutex::new(Some((watchdog, stdin))),
            bin: bin.clone(),
            data: data.clone(),
            options: options.clone(),
            as_nobody,
        };
        let run = |mut command: Command, what: &str| {
            let output = command.output().unwrap();
            assert!(
                output.status.success(),
                "{what} failed: {}\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                std::fs::read_to_string(dir.join("log")).unwrap_or_default()
            );
        };
        let mut initdb = tool("initdb");
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=scram-sha-256", "--no-sync"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-E", "UTF8"]);
        run(initdb, "initdb");
        // fsync off (`start`): a test cluster never needs to survive a crash. max_connections above
        // the default 100 (`options`, above): parallel tests each run servers with their own pools.
        let mut pg_ctl = tool("pg_ctl");
        pg_ctl
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("log"))
            .args(["-o", &options, "-w", "-t", "60", "start"]);
        run(pg_ctl, "pg_ctl start");
        Some(Postgres {
            authority: format!("postgres:{PASSWORD}@127.0.0.1:{port}"),
            host: "127.0.0.1".into(),
            port,
            admin_db: "postgres".into(),
            query: String::new(),
            cluster: Some(Box::new(cluster)),
        })
    }

    /// The server an admin URL names (`postgres://user:pw@host:port/db?params`).
    fn external(url: &str) -> Postgres {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .unwrap_or_else(|| panic!("{URL_VAR}: not a postgres:// URL"));
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, format!("?{query}")),
            None => (rest, String::new()),
        };
        let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = match host_port.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().expect("port in SVC_TEST_PG_URL")),
            None => (host_port, 5432),
        };
        Postgres {
            authority: authority.to_string(),
            host: host.to_string(),
            port,
            admin_db: if db.is_empty() {
                "postgres".into()
            } else {
                db.into()
            },
            query,
            cluster: None,
        }
    }

    /// The admin URL (a superuser on our own cluster).
    pub fn admin_url(&self) -> String {
        self.url_of(&self.authority, &self.admin_db)
    }

    /// `user` with `password` on the admin database.
    pub fn url_for(&self, user: &str, password: &str) -> String {
        let authority = format!("{user}:{password}@{}:{}", self.host, self.port);
        self.url_of(&authority, &self.admin_db)
    }

    fn url_of(&self, authority: &str, db: &str) -> String {
        format!("postgres://{authority}/{db}{}", self.query)
    }

    /// Creates a database no one else uses and returns its admin URL: each test (and each
    /// test server) gets its own, so they stay independent when they run in parallel.
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // The pid and a random part keep names unique across test processes and runs that
        // share one server (SVC_TEST_PG_URL).
        let name = format!(
            "svc_test_{}_{}_{:06x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>() & 0xff_ffff
        );
        let sql = format!("CREATE DATABASE {name}");
        self.with_admin(move |client| async move {
            client
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        });
        self.url_of(&self.authority, &name)
    }

    /// Whether a role of that name exists.
    pub fn role_exists(&self, role: &str) -> bool {
        let role = role.to_string();
        self.with_admin(move |client| async move {
            client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
                .await
                .unwrap()
                .is_some()
        })
    }

    /// Whether `user` can log in with `password` and run a query.
    pub fn can_login(&self, user: &str, password: &str) -> bool {
        let url = self.url_for(user, password);
        on_own_runtime(move || async move {
            match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    client
                        .query_one("SELECT current_user::text", &[])
                        .await
                        .is_ok()
                }
                Err(_) => false,
            }
        })
    }

    /// Runs `work` with a client connected to the admin URL.
    pub fn with_admin<T, F, Fut>(&self, work: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(tokio_postgres::Client) -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let url = self.admin_url();
        on_own_runtime(move || async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("cannot connect as admin: {e}"));
            tokio::spawn(connection);
            work(client).await
        })
    }

    /// Turns TLS on with this certificate and key (PEM files; copied into the cluster's
    /// directory, owned by its user, key mode 0600 as postgres demands) and reloads. Only on a
    /// cluster this process started.
    pub fn enable_tls(&self, cert: &Path, key: &Path) {
        let cluster = self
            .cluster
            .as_ref()
            .expect("enable_tls needs our own cluster");
        let as_nobody = unsafe { libc::geteuid() } == 0;
        for (from, name) in [(cert, "tls.pem"), (key, "tls.key")] {
            let to = cluster.dir.join(name);
            std::fs::copy(from, &to).unwrap();
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if as_nobody {
                let status = Command::new("chown")
                    .arg("nobody")
                    .arg(&to)
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
        let dir = cluster.dir.display().to_string();
        self.with_admin(move |client| async move {
            for sql in [
                format!("ALTER SYSTEM SET ssl_cert_file = '{dir}/tls.pem'"),
                format!("ALTER SYSTEM SET ssl_key_file = '{dir}/tls.key'"),
                "ALTER SYSTEM SET ssl = on".to_string(),
                "SELECT pg_reload_conf()".to_string(),
            ] {
                client
                    .batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        });
        // The reload is asynchronous: wait until a new backend sees it.
        for _ in 0..100 {
            let on = self.with_admin(|client| async move {
                let row = client.query_one("SHOW ssl", &[]).await.unwrap();
                row.get::<_, String>(0) == "on"
            });
            if on {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("ssl did not turn on: {}", self.log());
    }

    /// Stops our own cluster the way a crash would (`pg_ctl stop -m immediate`: every backend
    /// is killed, no checkpoint; the next start replays the WAL) and returns once it is down.
    pub fn kill(&self) {
        let cluster = self.cluster.as_ref().expect("kill needs our own cluster");
        let mut stop = cluster.tool("pg_ctl");
        stop.arg("-D")
            .arg(&cluster.data)
            .args(["-m", "immediate", "-w", "stop"]);
        cluster.run(stop, "pg_ctl stop");
    }

    /// Starts our own cluster again on the same port and data directory (after
    /// [`Postgres::kill`]) and returns once it accepts connections.
    pub fn start_again(&self) {
        let cluster = self
            .cluster
            .as_ref()
            .expect("start_again needs our own cluster");
        let mut start = cluster.tool("pg_ctl");
        start
            .arg("-D")
            .arg(&cluster.data)
            .arg("-l")
            .arg(cluster.dir.join("log"))
            .args(["-o", &cluster.options, "-w", "-t", "60", "start"]);
        cluster.run(start, "pg_ctl start");
    }

    /// The server's log file, when this process started the cluster.
    pub fn log(&self) -> String {
        self.cluster
            .as_ref()
            .and_then(|c| std::fs::read_to_string(c.dir.join("log")).ok())
            .unwrap_or_default()
    }
}

impl Cluster {
    /// A PostgreSQL tool run as the cluster's owner.
    fn tool(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        let mut command = if self.as_nobody {
            let mut c = Command::new("runuser");
            c.args(["-u", "nobody", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.current_dir(&self.dir);
        command
    }

    fn run(&self, mut command: Command, what: &str) {
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{what} failed: {}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Closing its stdin wakes the watchdog; waiting for it means the cluster is gone.
        if let Some((mut child, stdin)) = self.watchdog.lock().unwrap().take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// The watchdog's script (`$0` pg_ctl, `$1` the data directory, `$2` the cluster's
/// directory): `cat` returns when every write end of its stdin is closed, which is when the
/// test process has exited (the pipe is close-on-exec, so no other child holds it).
const WATCHDOG: &str = r#"cat >/dev/null
"$0" -D "$1" -m immediate -w stop >/dev/null 2>&1
rm -rf "$2""#;

/// Runs the future `make` makes on a runtime of its own on a thread of its own, so a synchronous helper
/// works both from plain tests and from inside a test's runtime (where `block_on` panics).
fn on_own_runtime<T, F, Fut>(make: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(make())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn find_postgres() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.flatten().map(|d| d.path().join("bin")).collect())
        .unwrap_or_default();
    candidates.sort();
    candidates.reverse();
    candidates.push(PathBuf::from("/usr/local/bin"));
    candidates.push(PathBuf::from("/usr/bin"));
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}
