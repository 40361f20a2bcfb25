//! A dcgm-exporter-compatible `/metrics` endpoint (`exporter_listen_addr`,
//! by convention `:9400`): the agent's telemetry — from any backend, the
//! simulator included — under the DCGM field names and labels
//! (`gpu`, `UUID`, `device`, `Hostname`), so existing Prometheus scrape
//! jobs, alert rules and Grafana dashboards work unchanged.
//!
//! Two deliberate differences from dcgm-exporter, so that `promtool check
//! metrics` accepts the output: the model is in `model_name` (promtool
//! rejects the camelCase `modelName`), and the ECC `_VOL_TOTAL` series are
//! typed `gauge` (promtool wants counters to end in lowercase `_total`; the
//! names must stay DCGM's). Queries and `rate()` work the same.
//!
//! A deliberately small HTTP/1.1 server: `GET /metrics` (and `/`), one
//! request per connection, a bounded request head and a read timeout. It
//! only reads; nothing here changes the node.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::service::Agent;
use nightshift_proto::{GpuInfo, Telemetry};

/// Largest request head read before answering 431.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// (name, type, help, value from a GPU's sample). Classic DCGM names, as
/// dcgm-exporter's default counters file has them.
type Getter = fn(&nightshift_proto::GpuTelemetry, &GpuInfo) -> Option<f64>;
const GPU_METRICS: &[(&str, &str, &str, Getter)] = &[
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", |g, _| Some(g.temperature_c)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", |g, _| Some(g.power_watts)),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", |g, _| Some(g.power_limit_watts)),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", |g, _| Some(g.util_pct)),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", |g, _| g.sm_clock_mhz.map(f64::from)),
    ("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in %).", |g, _| g.fan_pct),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", |g, i| {
        Some((g.mem_used_pct / 100.0 * i.mem_total_mib as f64).round())
    }),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", |g, i| {
        Some(i.mem_total_mib as f64 - (g.mem_used_pct / 100.0 * i.mem_total_mib as f64).round())
    }),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gauge", "Total number of single-bit volatile ECC errors.", |g, _| {
        Some(g.ecc_sbe_total as f64)
    }),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gauge", "Total number of double-bit volatile ECC errors.", |g, _| {
        Some(g.ecc_dbe_total as f64)
    }),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", |g, _| g.xid_last.map(f64::from)),
];

/// Escape a label value for the text exposition format.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// Render one telemetry sample in dcgm-exporter's text format.
pub fn render(t: &Telemetry, gpus: &[GpuInfo]) -> String {
    let mut out = String::with_capacity(4096);
    for (name, kind, help, get) in GPU_METRICS {
        let mut lines = String::new();
        for g in &t.gpus {
            let Some(info) = gpus.iter().find(|i| i.index == g.index) else { continue };
            let Some(v) = get(g, info) else { continue };
            let _ = writeln!(
                lines,
                "{name}{{gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",model_name=\"{}\",Hostname=\"{}\"}} {}",
                g.index,
                escape(info.uuid.as_deref().unwrap_or("")),
                g.index,
                escape(&info.name),
                escape(&t.node),
                v
            );
        }
        if !lines.is_empty() {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            out.push_str(&lines);
        }
    }
    out
}

/// Serve `/metrics` on `listener` until the task is aborted.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener) {
    loop {
        let Ok((mut stream, peer)) = listener.accept().await else { continue };
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD_BYTES {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let path = path.split('?').next().unwrap_or("");
            let (status, ctype, body) = if head.len() >= MAX_HEAD_BYTES {
                ("431 Request Header Fields Too Large", "text/plain", "request head too large\n".to_string())
            } else if method != "GET" && method != "HEAD" {
                ("405 Method Not Allowed", "text/plain", format!("expected GET, found {method}\n"))
            } else if path == "/metrics" {
                match agent.telemetry().await {
                    Ok(t) => {
                        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(&t, &agent.inventory().gpus))
                    }
                    Err((_, message)) => {
                        ("503 Service Unavailable", "text/plain", format!("cannot read the GPUs: {message}\n"))
                    }
                }
            } else if path == "/" {
                ("200 OK", "text/html", "<a href=\"/metrics\">metrics</a>\n".to_string())
            } else {
                ("404 Not Found", "text/plain", format!("no such path {path:?}: try /metrics\n"))
            };
            let body = if method == "HEAD" { String::new() } else { body };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(resp.as_bytes()).await {
                tracing::debug!(%peer, error = %e, "exporter: write failed");
            }
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::{GpuTelemetry, NodeTelemetry, Vendor};

    #[test]
    fn renders_dcgm_names_and_labels() {
        let info = GpuInfo {
            uuid: Some("GPU-1".into()),
            power_min_watts: 200.0,
            power_max_watts: 700.0,
            power_default_watts: 700.0,
            mem_total_mib: 81_559,
            fan_control: false,
            ..GpuInfo::new(0, "NVIDIA H100 80GB HBM3", Vendor::Nvidia)
        };
        let t = Telemetry {
            node: "gpu-a1".into(),
            ts_ms: 0,
            gpus: vec![GpuTelemetry {
                index: 0,
                temperature_c: 71.5,
                power_watts: 612.25,
                power_limit_watts: 700.0,
                util_pct: 85.0,
                mem_used_pct: 50.0,
                ecc_dbe_total: 2,
                xid_last: Some(79),
                ..Default::default()
            }],
            node_metrics: NodeTelemetry::default(),
        };
        let text = render(&t, &[info]);
        let labels = r#"{gpu="0",UUID="GPU-1",device="nvidia0",model_name="NVIDIA H100 80GB HBM3",Hostname="gpu-a1"}"#;
        for line in [
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge".to_string(),
            format!("DCGM_FI_DEV_GPU_TEMP{labels} 71.5"),
            format!("DCGM_FI_DEV_POWER_USAGE{labels} 612.25"),
            format!("DCGM_FI_DEV_FB_USED{labels} 40780"),
            format!("DCGM_FI_DEV_FB_FREE{labels} 40779"),
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL gauge".to_string(),
            format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{labels} 2"),
            format!("DCGM_FI_DEV_XID_ERRORS{labels} 79"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // No fan reading on this board: no fan series (not a zero).
        assert!(!text.contains("DCGM_FI_DEV_FAN_SPEED"));
        assert_eq!(escape("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
