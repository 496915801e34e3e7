//! File descriptors: the server raises its soft open-file limit to the hard one at start and
//! fits the listeners' connection caps into it, keeping a reserve for everything else (the
//! store, stream segments, the server's own bus client, outbound connections). A flood on one
//! port then meets that port's cap, never the process's limit, so the other ports and the
//! store keep working (EMFILE would otherwise refuse every accept and file open alike).

use crate::config::ServerConfig;

/// Descriptors kept for the process itself beside the listeners' connections.
pub const RESERVE: u64 = 128;
/// No listener's cap is fitted below this.
const MIN_CAP: usize = 16;

/// The open-file limits (soft, hard) after raising soft to hard where allowed.
pub fn raise_nofile_limit() -> (u64, u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return (1024, 1024);
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    (limit.rlim_cur, limit.rlim_max)
}

/// The connection caps for REST, gRPC and the bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub http: usize,
    pub grpc: usize,
    pub bus: usize,
}

/// The configured caps, scaled down together (each at least `MIN_CAP`, or what was
/// configured if lower) when they would not fit into `nofile` less the reserve.
pub fn fit(config: &ServerConfig, nofile: u64) -> Caps {
    let wanted = Caps {
        http: config.limits.max_connections,
        grpc: config.limits.max_connections,
        bus: if config.bus.external_urls.is_empty() {
            config.bus.max_connections
        } else {
            0
        },
    };
    let total = (wanted.http + wanted.grpc + wanted.bus) as u64;
    let budget = nofile.saturating_sub(RESERVE).max(3 * MIN_CAP as u64);
    if total <= budget {
        return wanted;
    }
    // Never above what was configured; never below MIN_CAP unless configured lower.
    let scale = |cap: usize| ((cap as u64 * budget / total) as usize).clamp(cap.min(MIN_CAP), cap);
    Caps {
        http: scale(wanted.http),
        grpc: scale(wanted.grpc),
        bus: scale(wanted.bus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_the_limit_with_a_reserve() {
        let config = ServerConfig::default();
        let roomy = fit(&config, 1 << 20);
        assert_eq!(
            roomy,
            Caps {
                http: 4096,
                grpc: 4096,
                bus: 65536
            }
        );
        let tight = fit(&config, 1024);
        assert!(
            (tight.http + tight.grpc + tight.bus) as u64 <= 1024 - RESERVE + 2 * MIN_CAP as u64
        );
        assert!(tight.http >= MIN_CAP && tight.grpc >= MIN_CAP && tight.bus > tight.http);
        // A small configured cap is never raised by the fitting.
        let mut small = ServerConfig::default();
        small.limits.max_connections = 3;
        assert_eq!(fit(&small, 1024).http, 3);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = raise_nofile_limit();
        // An unlimited hard limit may be refused as a soft one (fs.nr_open); then soft stays.
        assert!(
            soft == hard || hard == libc::RLIM_INFINITY,
            "{soft} < {hard}"
        );
    }
}
