//! Real external programs for the integration tests (Prometheus,
//! Alertmanager, promtool): find them, start them on loopback, stop them.
//! `.ci/run` installs the Debian packages; without them a test fails saying
//! which package to install, unless `NIGHTSHIFT_SKIP_EXTERNAL=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed on drop, its output in `log`.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Start `argv` with stdout and stderr into `log`.
    pub fn start(argv: &[String], log: &Path) -> Daemon {
        Daemon::start_in(argv, log, Path::new("."))
    }

    /// [`Daemon::start`] in the working directory `cwd`.
    pub fn start_in(argv: &[String], log: &Path, cwd: &Path) -> Daemon {
        let out = std::fs::File::create(log).expect("log file");
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(cwd)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", argv[0]));
        Daemon { child, log: log.to_path_buf() }
    }

    /// The log so far (for failure messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The path of `program`, or `None` (after saying so) when the test should
/// be skipped; panics naming the package otherwise.
pub fn require(program: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(program)).find(|p| p.is_file()));
    match found {
        Some(p) => Some(p),
        None if std::env::var("NIGHTSHIFT_SKIP_EXTERNAL").as_deref() == Ok("1") => {
            eprintln!("skipped: {program} not installed (NIGHTSHIFT_SKIP_EXTERNAL=1)");
            None
        }
        None => panic!(
            "{program} is not installed: `apt-get install {package}` (.ci/run does), or set NIGHTSHIFT_SKIP_EXTERNAL=1 to skip"
        ),
    }
}

/// A real Prometheus on a free loopback port with `config`, its TSDB in
/// `tsdb` (and `extra` flags), ready to answer; and its URL.
pub async fn start_prometheus(
    prometheus: &Path,
    config: &Path,
    tsdb: &Path,
    extra: &[&str],
    log: &Path,
) -> (Daemon, String) {
    let port = free_port();
    let mut argv = vec![
        prometheus.display().to_string(),
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", tsdb.display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let daemon = Daemon::start(&argv, log);
    let url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{url}/-/ready"), 60, &daemon).await;
    (daemon, url)
}

/// A free loopback port.
///
/// Never the same port twice in one process: the kernel may hand a just-closed
/// ephemeral port out again at once, and two daemons told the same port make a
/// test fail for the wrong reason (two agents on one address, one refused for
/// the other's host key).
/// Processes whose command line names `path` (read from /proc): what a
/// test started under its own folder, however it was started (a daemon a
/// daemon forked, a browser's renderer).
pub fn processes_naming(path: &Path) -> Vec<i32> {
    let needle = path.display().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id() as i32;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle.as_str()))
        })
        .collect()
}

/// Kill (SIGKILL) every process naming `path` until none is left (at most
/// 5 s): a test leaves nothing running (issue 56 point 8). Returns what
/// was still running when asked.
pub fn kill_processes_naming(path: &Path) -> Vec<i32> {
    let first = processes_naming(path);
    for _ in 0..50 {
        let left = processes_naming(path);
        if left.is_empty() {
            break;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    first
}

/// A real Alertmanager (`am`) with the config in `dir/alertmanager.yml`
/// on loopback `port`, its storage in `dir/am-data` (a restart on the same
/// `dir` and `port` keeps its notification log), its log `dir/<log>`;
/// ready when this returns.
pub async fn alertmanager_at(am: &Path, dir: &Path, port: u16, log: &str) -> Daemon {
    let daemon = Daemon::start(
        &[
            am.display().to_string(),
            format!("--config.file={}", dir.join("alertmanager.yml").display()),
            format!("--storage.path={}", dir.join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--cluster.listen-address=".into(),
        ],
        &dir.join(log),
    );
    wait_http_ok(&format!("http://127.0.0.1:{port}/-/ready"), 60, &daemon).await;
    daemon
}

/// The shipped notification target of `examples/engine.yaml` (its line with
/// `format: alertmanager`), pointed at the Alertmanager at `url`.
pub fn shipped_alertmanager_target(url: &str) -> String {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/engine.yaml")).unwrap();
    shipped
        .lines()
        .find(|l| l.contains("format: alertmanager"))
        .expect("examples/engine.yaml ships an alertmanager target")
        .replace("http://127.0.0.1:9093", url)
}

pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Wait until `url` answers 200.
pub async fn wait_http_ok(url: &str, secs: u64, daemon: &Daemon) {
    let http = reqwest::Client::new();
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(r) = http.get(url).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < end, "{url} did not answer within {secs} s; log:\n{}", daemon.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The folder holding the workspace's binaries (`nightshift`,
/// `nightshift-agent`). `cargo test --workspace` builds them; when they are
/// missing or older than the sources (a `cargo test -p nightshift-tests`
/// after an edit), they are built here first.
pub fn workspace_bin_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // target/<profile>/deps/<this test> → target/<profile>
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let newest_source = ["proto", "audit", "agent", "engine", "sim", "web", "cli"]
                .iter()
                .filter_map(|c| newest_mtime(&root.join(c).join("src")))
                .max();
            let fresh = ["nightshift", "nightshift-agent"].iter().all(|b| {
                let built = std::fs::metadata(dir.join(b)).and_then(|m| m.modified()).ok();
                matches!((built, newest_source), (Some(b), Some(s)) if b >= s)
            });
            if !fresh {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                let status = Command::new(cargo)
                    .args(["build", "-q", "-p", "nightshift", "-p", "nightshift-agent", "--bins"])
                    .current_dir(&root)
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "cargo build of the nightshift binaries failed");
            }
            dir
        })
        .clone()
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let t = if e.file_type().ok()?.is_dir() { newest_mtime(&e.path()) } else { e.metadata().ok()?.modified().ok() };
        newest = newest.max(t);
    }
    newest
}

/// A tiny HTTP receiver: records each JSON body; answers 500 to the first
/// `fail_first` requests, then 200.
pub async fn receiver(fail_first: usize) -> (String, std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let got: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
    let g = got.clone();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        let mut n = 0usize;
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Head, then as many body bytes as Content-Length says.
            let body = loop {
                let k = s.read(&mut chunk).await.unwrap();
                if k == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..k]);
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        let k = s.read(&mut chunk).await.unwrap();
                        buf.extend_from_slice(&chunk[..k]);
                    }
                    break Some(buf[end + 4..end + 4 + len].to_vec());
                }
            };
            let Some(body) = body else { continue };
            n += 1;
            g.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
            let status = if n <= fail_first { "500 Internal Server Error" } else { "200 OK" };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                .await;
        }
    });
    (url, got)
}

/// A throwaway PostgreSQL cluster (the Debian `postgresql` package): made
/// with `initdb` in a temporary folder, served on a free loopback port, and
/// killed on drop. As root, it runs as the `postgres` user (`initdb`
/// refuses root), through `setpriv`, which execs without forking.
pub struct PgCluster {
    pub daemon: Daemon,
    /// How the server was started (a restart runs it again).
    argv: Vec<String>,
    dir: PathBuf,
    /// `pg_isready`, beside `postgres`.
    isready: PathBuf,
    /// `host=127.0.0.1 port=… user=nightshift dbname=postgres`.
    pub conninfo: String,
    pub port: u16,
}

/// The folder holding `initdb`, `postgres`: on the PATH, else Debian's
/// versioned folder. `None` (after saying so) to skip, as [`require`].
pub fn postgres_bin_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("initdb")).find(|p| p.is_file()))
    {
        return p.parent().map(Path::to_path_buf);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    versions.sort();
    if let Some(p) = versions.pop() {
        return Some(p);
    }
    require("initdb", "postgresql").and_then(|p| p.parent().map(Path::to_path_buf))
}

/// Make `path` the `postgres` user's (when running as root, the server
/// runs as that user) with mode 0600, as PostgreSQL wants its TLS key.
pub fn give_to_postgres(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    if nix::unistd::Uid::effective().is_root() {
        let pg =
            nix::unistd::User::from_name("postgres").ok().flatten().expect("the postgres user (package postgresql)");
        nix::unistd::chown(path, Some(pg.uid), Some(pg.gid)).expect("chown to postgres");
    }
}

impl PgCluster {
    /// Make and start a cluster under `dir` (which it takes over).
    pub fn start(dir: &Path, bin: &Path) -> PgCluster {
        PgCluster::start_with(dir, bin, &[])
    }

    /// [`PgCluster::start`] with more server settings (`-c name=value`).
    pub fn start_with(dir: &Path, bin: &Path, settings: &[&str]) -> PgCluster {
        let data = dir.join("pgdata");
        let root = nix::unistd::Uid::effective().is_root();
        let as_pg = |program: &Path, args: &[String]| -> Vec<String> {
            let mut v = Vec::new();
            if root {
                v.extend(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"].map(String::from));
            }
            v.push(program.display().to_string());
            v.extend(args.iter().cloned());
            v
        };
        if root {
            let pg = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("the postgres user (package postgresql)");
            nix::unistd::chown(dir, Some(pg.uid), Some(pg.gid)).expect("chown the cluster folder to postgres");
        }
        let init = as_pg(
            &bin.join("initdb"),
            &[
                "-D".into(),
                data.display().to_string(),
                "-U".into(),
                "nightshift".into(),
                "-A".into(),
                "trust".into(),
                "--no-sync".into(),
            ],
        );
        let out = Command::new(&init[0]).args(&init[1..]).output().expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut args = vec![
            "-D".into(),
            data.display().to_string(),
            "-p".into(),
            port.to_string(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-k".into(),
            dir.display().to_string(),
        ];
        for s in settings {
            args.extend(["-c".to_string(), s.to_string()]);
        }
        let run = as_pg(&bin.join("postgres"), &args);
        let daemon = Daemon::start(&run, &dir.join("postgres.log"));
        let mut c = PgCluster {
            daemon,
            argv: run,
            dir: dir.to_path_buf(),
            // Beside the real `postgres` (the PATH may hold only links to
            // initdb and postgres).
            isready: std::fs::canonicalize(bin.join("postgres"))
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("pg_isready")))
                .filter(|p| p.is_file())
                .unwrap_or_else(|| bin.join("pg_isready")),
            conninfo: format!("host=127.0.0.1 port={port} user=nightshift dbname=postgres"),
            port,
        };
        c.wait_ready();
        c
    }

    /// Whether the server accepts a connection and a session now
    /// (`pg_isready`: 0 only once start-up or recovery is over). An open
    /// port is not enough: while it starts up or recovers it refuses
    /// sessions ("the database system is starting up"), and a test racing
    /// it fails.
    pub fn answers(&self) -> bool {
        Command::new(&self.isready)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "nightshift", "-d", "postgres", "-t", "2"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn wait_ready(&mut self) {
        let end = Instant::now() + Duration::from_secs(60);
        while !self.answers() {
            if Instant::now() >= end {
                let o = Command::new(&self.isready).args(["-h", "127.0.0.1", "-p", &self.port.to_string()]).output();
                panic!("postgres did not answer on {} ({o:?}); log:\n{}", self.port, self.daemon.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Crash the server (SIGKILL: every connection drops, nothing is shut
    /// down cleanly), wait `down`, start it again on the same data and port
    /// (it recovers from its WAL) and wait until it listens. Returns how
    /// long the database was unreachable.
    pub fn crash_and_restart(&mut self, down: Duration) -> Duration {
        let t0 = Instant::now();
        let _ = self.daemon.child.kill();
        let _ = self.daemon.child.wait();
        // The postmaster's children notice its death and exit; a new
        // postmaster refuses to start while they still hold the shared
        // memory, so retry until it comes up.
        std::thread::sleep(down);
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            self.daemon = Daemon::start(&self.argv, &self.dir.join("postgres-restart.log"));
            let up = Instant::now() + Duration::from_secs(10);
            while Instant::now() < up {
                if self.answers() {
                    return t0.elapsed();
                }
                if let Ok(Some(_)) = self.daemon.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(Instant::now() < end, "postgres did not come back; log:\n{}", self.daemon.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
