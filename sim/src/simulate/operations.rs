//! Operations the fleet-month meets besides faults: the engine restarted
//! for an upgrade, and the pager down for a while. What the report counts
//! from them — mitigations a restart weakened, pages lost — is measured on
//! the simulated hardware and at a real HTTP receiver, not taken from the
//! engine's word.
//!
//! - [`Pager`]: the on-call person's pager, an HTTP receiver on loopback
//!   (the engine's webhook target) that keeps the audit sequence of every
//!   notice it takes, and answers 503 while it is down;
//! - [`Mitigation`]: what is in force on a node (drained, each GPU's
//!   power limit and drain), read from the agent before a restart and
//!   compared with what is in force for the next
//!   [`WATCH_AFTER_RESTART_MS`] while the node's fault persists.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nightshift_engine::config::{WebhookFormat, WebhookTarget};
use nightshift_proto::Telemetry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long after a restart a mitigation must stay in force (issue 56's
/// bar: continuously for 10 minutes while the fault persists).
pub const WATCH_AFTER_RESTART_MS: i64 = 10 * 60_000;

/// The pager: every notice's `audit_seq` it took, and whether it is down.
pub struct Pager {
    pub port: u16,
    down: Arc<AtomicBool>,
    got: Arc<Mutex<BTreeSet<u64>>>,
}

impl Pager {
    /// Listen on a free loopback port.
    pub async fn start() -> std::io::Result<Pager> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let down = Arc::new(AtomicBool::new(false));
        let got: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
        let (d, g) = (down.clone(), got.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let (d, g) = (d.clone(), g.clone());
                tokio::spawn(async move {
                    let body = read_request(&mut s).await;
                    let status = if d.load(Ordering::SeqCst) {
                        "503 Service Unavailable"
                    } else {
                        let seq = body
                            .as_deref()
                            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                            .and_then(|v| v["audit_seq"].as_u64());
                        if let Some(seq) = seq {
                            g.lock().unwrap_or_else(|e| e.into_inner()).insert(seq);
                        }
                        "200 OK"
                    };
                    let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        Ok(Pager { port, down, got })
    }

    /// The engine's webhook target for this pager (generic JSON, every
    /// notice, one attempt a time: the engine's outbox retries).
    pub fn target(&self) -> WebhookTarget {
        WebhookTarget {
            name: "pager".into(),
            url: format!("http://127.0.0.1:{}/page", self.port),
            format: WebhookFormat::Generic,
            escalations_only: false,
            timeout_secs: 2,
            max_attempts: 1,
            dry_runs: false,
            audit_anchors: false,
            firing_secs: 3600,
            fallback: None,
        }
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// The notices it took, by audit sequence.
    pub fn received(&self) -> BTreeSet<u64> {
        self.got.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One HTTP request's body (`None`: the connection ended first).
async fn read_request(s: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let k = s.read(&mut chunk).await.ok()?;
        if k == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..k]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize =
                head.lines().find_map(|l| l.strip_prefix("content-length:").and_then(|v| v.trim().parse().ok()))?;
            if buf.len() >= end + 4 + len {
                return Some(buf[end + 4..end + 4 + len].to_vec());
            }
        }
        if buf.len() > 1 << 20 {
            return None;
        }
    }
}

/// What is in force on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Mitigation {
    pub drained: bool,
    /// GPU → (power limit in watts, drained).
    pub gpus: BTreeMap<u32, (f64, bool)>,
}

impl Mitigation {
    pub fn of(t: &Telemetry) -> Mitigation {
        Mitigation {
            drained: t.node_metrics.drained,
            gpus: t.gpus.iter().map(|g| (g.index, (g.power_limit_watts, g.gpu_drained))).collect(),
        }
    }

    /// Whether anything is in force at all (a drain, or a GPU capped below
    /// `max_watts`).
    pub fn any(&self, max_watts: f64) -> bool {
        self.drained || self.gpus.values().any(|&(w, d)| d || w < max_watts - 1.0)
    }

    /// What `now` lacks of `self`: the node no longer drained, a GPU's
    /// drain gone, or its cap raised (by more than a watt). A node drained
    /// now keeps its work off whatever else changed.
    pub fn weakened_in(&self, now: &Mitigation) -> Option<String> {
        if now.drained {
            return None;
        }
        if self.drained {
            return Some("the node's drain".into());
        }
        for (gpu, &(w, d)) in &self.gpus {
            let (w2, d2) = now.gpus.get(gpu).copied().unwrap_or((f64::INFINITY, false));
            if d && !d2 {
                return Some(format!("GPU {gpu}'s drain"));
            }
            if w2 > w + 1.0 {
                return Some(format!("GPU {gpu}'s cap ({w:.0} W, now {w2:.0} W)"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(drained: bool, gpus: &[(u32, f64, bool)]) -> Mitigation {
        Mitigation { drained, gpus: gpus.iter().map(|&(g, w, d)| (g, (w, d))).collect() }
    }

    #[test]
    fn a_mitigation_is_weakened_when_a_drain_or_a_cap_is_gone_and_not_when_it_grew() {
        let capped = m(false, &[(0, 700.0, false), (3, 525.0, false)]);
        for (now, want) in [
            (m(false, &[(0, 700.0, false), (3, 525.0, false)]), None),
            (m(false, &[(0, 700.0, false), (3, 450.0, false)]), None),
            (m(true, &[(0, 700.0, false), (3, 700.0, false)]), None),
            (m(false, &[(0, 700.0, false), (3, 700.0, false)]), Some("GPU 3's cap (525 W, now 700 W)")),
        ] {
            assert_eq!(capped.weakened_in(&now).as_deref(), want, "{now:?}");
        }
        let drained = m(true, &[(0, 700.0, false)]);
        assert_eq!(drained.weakened_in(&m(false, &[(0, 700.0, false)])).as_deref(), Some("the node's drain"));
        let gpu_out = m(false, &[(1, 700.0, true)]);
        assert_eq!(gpu_out.weakened_in(&m(false, &[(1, 700.0, false)])).as_deref(), Some("GPU 1's drain"));
        assert!(capped.any(700.0) && drained.any(700.0) && !m(false, &[(0, 700.0, false)]).any(700.0));
    }

    #[tokio::test]
    async fn the_pager_takes_notices_and_refuses_them_while_down() {
        let p = Pager::start().await.unwrap();
        let send = |seq: u64| async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port)).await.unwrap();
            let body = format!("{{\"audit_seq\": {seq}}}");
            let req = format!("POST /page HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            s.write_all(req.as_bytes()).await.unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).await.unwrap();
            reply
        };
        assert!(send(7).await.starts_with("HTTP/1.1 200"));
        p.set_down(true);
        assert!(send(8).await.starts_with("HTTP/1.1 503"));
        p.set_down(false);
        assert!(send(9).await.starts_with("HTTP/1.1 200"));
        assert_eq!(p.received(), BTreeSet::from([7, 9]));
    }
}
