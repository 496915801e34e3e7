//! moto's S3 server for tests (tests/s3.rs, tests/backup.rs): one per test on an ephemeral
//! port, killed on drop. Without moto, `start` says "skipped: no moto_server" and returns None,
//! unless `CI` is set: then a missing moto fails the test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A moto server on 127.0.0.1 and an ephemeral port.
pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Moto {
    /// `None` (after saying so) when moto is not installed and `CI` is unset.
    pub fn start() -> Option<Moto> {
        let candidates: [(&str, &[&str]); 2] = [
            ("moto_server", &["-p", "0"]),
            ("python3", &["-m", "moto.server", "-p", "0"]),
        ];
        for (program, args) in candidates {
            let Ok(mut child) = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
            else {
                continue;
            };
            // moto logs every request on stderr: keep reading it so the pipe never fills.
            let stderr = child.stderr.take().unwrap();
            let (sender, receiver) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(address) = line.split("Running on http://").nth(1) {
                        let port = address.trim().rsplit(':').next().unwrap().parse::<u16>();
                        let _ = sender.send(port.ok());
                    }
                }
                let _ = sender.send(None);
            });
            match receiver.recv_timeout(Duration::from_secs(60)) {
                Ok(Some(port)) => return Some(Moto { child, port }),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        if std::env::var_os("CI").is_some() {
            panic!("moto_server is missing (pip install 'moto[server]'), and CI is set");
        }
        eprintln!("skipped: no moto_server");
        None
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
