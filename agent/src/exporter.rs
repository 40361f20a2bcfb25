//! A dcgm-exporter-compatible `/metrics` endpoint (`exporter_listen_addr`,
//! by convention `:9400`): the agent's telemetry — from any backend, the
//! simulator included — under DCGM's field names, types and help texts and
//! with dcgm-exporter's labels in its order (`gpu`, `UUID`, `pci_bus_id`,
//! `device`, `modelName`, `Hostname`, then `DCGM_FI_DRIVER_VERSION`), so
//! existing Prometheus scrape jobs, alert rules and Grafana dashboards work
//! unchanged. `tests/tests/it/prometheus.rs` compares the output with
//! dcgm-exporter's own counters list and label template.
//!
//! Being exact costs two `promtool check metrics` lint findings that
//! dcgm-exporter's own output has too: the camelCase `modelName` label, and
//! counters whose DCGM names do not end in `_total`. They are warnings
//! about naming style, not parse errors; the test accepts exactly those.
//!
//! Served by axum on hyper, one connection per task: at most 64 at once, a
//! client that sends nothing for 5 s is closed, and a kept-alive
//! connection gives its slot back after a minute. It
//! only reads; nothing here changes the node.
//!
//! After the DCGM fields come the jobs' own `nightshift_*` series from
//! `job_metrics_dir`, with `Hostname` set by the agent and the job's own
//! host labels dropped: a job cannot make its readings another node's.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::service::Agent;
use nightshift_proto::exposition::{Family, escape, fmt_value, write};
use nightshift_proto::{GpuInfo, GpuTelemetry, Telemetry, Vendor};

/// Connections served at once (a request sent); more wait for a slot.
const MAX_CONNECTIONS: usize = 64;
/// Connections accepted that have sent nothing yet; past this the newest
/// is closed at once.
const MAX_PENDING: usize = 4096;
/// A client must send its request head within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// ... or within this while more than [`MAX_CONNECTIONS`] connections wait
/// for their first byte: a scraper sends its request as it connects, a
/// flood of idle connections is shed in a quarter second.
const BUSY_HEAD_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a connection that sent its request waits for a slot.
const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Longest a connection keeps its slot, kept alive or not.
const MAX_CONNECTION_LIFE: Duration = Duration::from_secs(60);

/// A value from a GPU's sample.
type Getter = fn(&GpuTelemetry, &GpuInfo) -> Option<f64>;

/// One exported field: DCGM name, Prometheus type and help, as
/// dcgm-exporter's counters files write them.
struct Field {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: Getter,
}

const fn field(name: &'static str, kind: &'static str, help: &'static str, get: Getter) -> Field {
    Field { name, kind, help, get }
}

/// The reasons as NVML's clocks-event bitmask.
fn clock_event_bits(reasons: &[String]) -> u64 {
    reasons.iter().filter_map(|r| nightshift_proto::throttle_reason_bit(r)).fold(0, |bits, b| bits | b)
}

fn fb_used(g: &GpuTelemetry, i: &GpuInfo) -> f64 {
    (g.mem_used_pct / 100.0 * i.mem_total_mib as f64).round()
}

/// In dcgm-exporter's default order; absent readings are left out, never
/// written as zero.
const FIELDS: &[Field] = &[
    field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", |g, _| g.sm_clock_mhz.map(f64::from)),
    field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", |g, _| g.mem_clock_mhz.map(f64::from)),
    field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", |g, _| g.mem_temperature_c),
    field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", |g, _| Some(g.temperature_c)),
    field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", |g, _| Some(g.power_watts)),
    field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", |g, _| Some(g.power_limit_watts)),
    field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", |g, _| {
        g.energy_mj.map(|v| v as f64)
    }),
    field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", |g, _| {
        g.pcie_replay_total.map(|v| v as f64)
    }),
    field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", |g, _| Some(g.util_pct)),
    field("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in %).", |g, _| g.fan_pct),
    field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask).", |g, _| {
        Some(clock_event_bits(&g.throttle_reasons) as f64)
    }),
    field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", |g, _| {
        g.xid_last.map(f64::from)
    }),
    field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", |g, i| {
        Some(i.mem_total_mib as f64 - fb_used(g, i))
    }),
    field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", |g, i| Some(fb_used(g, i))),
    field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", |g, _| {
        Some(g.ecc_sbe_total as f64)
    }),
    field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", |g, _| {
        Some(g.ecc_dbe_total as f64)
    }),
    field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        |g, _| g.nvlink_bytes_total.map(|v| v as f64),
    ),
    field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        |g, _| g.remapped_rows_uncorrectable.map(|v| v as f64),
    ),
    field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        |g, _| g.remapped_rows_correctable.map(|v| v as f64),
    ),
    field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", |g, _| {
        g.row_remap_failure.map(|f| if f { 1.0 } else { 0.0 })
    }),
    // A profiling field: a ratio, where the backend reads it (the
    // simulator's NVIDIA profiles; on real nodes DCGM's own exporter).
    field("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", |g, _| {
        g.sm_active_pct.map(|p| p / 100.0)
    }),
];

/// A GPU's labels, as dcgm-exporter writes them (its template, in order).
fn labels(info: &GpuInfo, node: &str, driver: Option<&str>) -> String {
    let device = match info.vendor {
        Vendor::Nvidia => format!("nvidia{}", info.index),
        Vendor::Amd => format!("card{}", info.index),
    };
    let mut l = format!(
        "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"{device}\",modelName=\"{}\",Hostname=\"{}\"",
        info.index,
        escape(info.uuid.as_deref().unwrap_or("")),
        escape(info.pci_bus_id.as_deref().unwrap_or("")),
        escape(&info.name),
        escape(node)
    );
    if let Some(d) = driver {
        let _ = write!(l, ",DCGM_FI_DRIVER_VERSION=\"{}\"", escape(d));
    }
    l
}

/// Render one telemetry sample in dcgm-exporter's text format.
pub fn render(t: &Telemetry, gpus: &[GpuInfo], driver: Option<&str>) -> String {
    let mut out = String::with_capacity(8192);
    let labelled: Vec<(&GpuTelemetry, &GpuInfo, String)> = t
        .gpus
        .iter()
        .filter_map(|g| gpus.iter().find(|i| i.index == g.index).map(|i| (g, i, labels(i, &t.node, driver))))
        .collect();
    for f in FIELDS {
        let mut lines = String::new();
        for (g, info, l) in &labelled {
            let Some(v) = (f.get)(g, info) else { continue };
            if !v.is_finite() {
                continue;
            }
            let _ = writeln!(lines, "{}{{{l}}} {}", f.name, fmt_value(v));
        }
        if !lines.is_empty() {
            let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, f.kind);
            out.push_str(&lines);
        }
    }
    out
}

/// nightshift's own lines after the DCGM fields: whether the agent can
/// record changes durably (written by `prometheus-client`, as the engine's
/// `/metrics` is).
fn render_agent(t: &Telemetry) -> String {
    let degraded = Family::gauges(
        "nightshift_agent_state_degraded",
        "1 while the agent cannot write its state log (a full or failing disk): it refuses every change until it can.",
        vec![(
            nightshift_proto::exposition::labels([("Hostname", t.node.as_str())]),
            f64::from(u8::from(t.node_metrics.state_degraded.is_some())),
        )],
    );
    // A gauge's name is not checked: writing it cannot fail.
    write(vec![degraded]).unwrap_or_default()
}

async fn metrics(State(agent): State<Arc<Agent>>) -> Response {
    match agent.telemetry().await {
        Ok(t) => {
            let inv = agent.inventory();
            let mut body = render(&t, &inv.gpus, inv.driver_version.as_deref());
            body.push_str(&render_agent(&t));
            body.push_str(&agent.job_series());
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
        }
        Err((_, message)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("cannot read the GPUs: {message}\n")).into_response()
        }
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    (StatusCode::NOT_FOUND, format!("no such path {:?}: try /metrics\n", uri.path())).into_response()
}

/// The exporter's routes: `GET /metrics` (and `HEAD`), `/` links to it.
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html")], "<a href=\"/metrics\">metrics</a>\n") }))
        .fallback(not_found)
        .with_state(agent)
}

/// Serve `/metrics` on `listener` until the task is aborted.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let app = router(agent);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Accept first, always: a slot is taken only once a connection has sent
    // its request, so idle connections can never keep a scrape out (they
    // used to take the 64 slots before `accept`).
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "exporter: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let waiting = pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if waiting >= MAX_PENDING {
            pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
            continue;
        }
        let service = TowerToHyperService::new(app.clone());
        let (slots, pending) = (slots.clone(), pending.clone());
        tokio::spawn(async move {
            // hyper's head deadline starts with the first byte: a client
            // that connects and sends nothing would hold its connection
            // forever. (`peek`, not `readable`: readiness may be reported
            // before any byte arrives.)
            let deadline = if waiting >= MAX_CONNECTIONS { BUSY_HEAD_TIMEOUT } else { HEAD_TIMEOUT };
            let mut first = [0u8; 1];
            let sent = matches!(tokio::time::timeout(deadline, stream.peek(&mut first)).await, Ok(Ok(1)));
            pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            if !sent {
                tracing::debug!(%peer, "exporter: nothing sent within the head deadline; closed");
                return;
            }
            let Ok(Ok(permit)) = tokio::time::timeout(SLOT_WAIT, slots.acquire_owned()).await else {
                tracing::debug!(%peer, "exporter: no slot free in time; closed");
                return;
            };
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT).max_buf_size(16 * 1024);
            // A kept-alive connection gives its slot back after a while
            // (scrapers reconnect).
            match tokio::time::timeout(MAX_CONNECTION_LIFE, builder.serve_connection(TokioIo::new(stream), service))
                .await
            {
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "exporter: connection ended with an error"),
                Err(_) => tracing::debug!(%peer, "exporter: connection closed after its time"),
                Ok(Ok(())) => {}
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::NodeTelemetry;

    #[test]
    fn renders_dcgm_names_labels_and_types() {
        let info = GpuInfo {
            uuid: Some("GPU-1".into()),
            pci_bus_id: Some("00000000:18:00.0".into()),
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
                energy_mj: Some(123_456),
                row_remap_failure: Some(false),
                mem_temperature_c: Some(f64::NAN),
                throttle_reasons: vec!["hw_slowdown".into(), "hw_thermal_slowdown".into()],
                ..Default::default()
            }],
            node_metrics: NodeTelemetry::default(),
        };
        let text = render(&t, &[info], Some("550.54.15"));
        let labels = r#"{gpu="0",UUID="GPU-1",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-a1",DCGM_FI_DRIVER_VERSION="550.54.15"}"#;
        for line in [
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge".to_string(),
            format!("DCGM_FI_DEV_GPU_TEMP{labels} 71.5"),
            format!("DCGM_FI_DEV_POWER_USAGE{labels} 612.25"),
            format!("DCGM_FI_DEV_FB_USED{labels} 40780"),
            format!("DCGM_FI_DEV_FB_FREE{labels} 40779"),
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter".to_string(),
            format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{labels} 2"),
            format!("DCGM_FI_DEV_XID_ERRORS{labels} 79"),
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter".to_string(),
            format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{labels} 123456"),
            format!("DCGM_FI_DEV_ROW_REMAP_FAILURE{labels} 0"),
            // NVML's bits: HW_SLOWDOWN 0x8 | HW_THERMAL_SLOWDOWN 0x40.
            format!("DCGM_FI_DEV_CLOCKS_EVENT_REASONS{labels} 72"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // No fan or memory clock reading on this board: no series (not a
        // zero); a NaN reading is left out too.
        for absent in ["DCGM_FI_DEV_FAN_SPEED", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP"] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
        assert_eq!(escape("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
        // The agent's own line, with a host name that needs escaping.
        let t = Telemetry { node: "n\"1".into(), ..t };
        let own = render_agent(&t);
        assert!(own.contains("# TYPE nightshift_agent_state_degraded gauge\n"), "{own}");
        assert!(own.contains("nightshift_agent_state_degraded{Hostname=\"n\\\"1\"} 0\n"), "{own}");
    }
}
