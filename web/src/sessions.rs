//! The UI's sign-in sessions. The cookie holds a random session id; the
//! store keeps only its SHA-256 (so the file at rest holds nothing a
//! browser could present), the digest of the token it was opened with (a
//! token removed by a reload ends its sessions too) and when it ends. Kept
//! in `<data_dir>/sessions.json` (mode 0600, written whole and renamed) so
//! an engine restart or upgrade logs nobody out; in memory only where no
//! file is given (tests, the demo).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a session lasts.
pub const SESSION_SECS: u64 = 12 * 3600;

/// The most sessions one token holds at once: a login past it ends that
/// token's oldest session (a script logging in in a loop cannot grow the
/// table without bound, and a stolen token's sessions age out of it).
pub const SESSIONS_PER_TOKEN: usize = 16;

/// SHA-256 of the session id → (the token's digest, when it ends in ms).
type Table = HashMap<[u8; 32], ([u8; 32], i64)>;

/// The sign-in sessions of one engine.
#[derive(Debug, Default)]
pub struct Sessions {
    table: Mutex<Table>,
    file: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    version: u32,
    sessions: Vec<SavedSession>,
}

#[derive(Serialize, Deserialize)]
struct SavedSession {
    id_sha256: String,
    token_sha256: String,
    ends_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    hex::decode(s).ok().and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
}

/// Stores by file: every router of one engine (the server's, a test's
/// one-shot ones) shares its engine's sessions rather than overwriting
/// each other's file.
static OPEN: std::sync::LazyLock<Mutex<HashMap<PathBuf, std::sync::Weak<Sessions>>>> =
    std::sync::LazyLock::new(Default::default);

impl Sessions {
    /// The sessions kept in `file`, shared with every other user of it in
    /// this process (read from the file by the first).
    pub fn shared(file: PathBuf) -> std::sync::Arc<Sessions> {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = open.get(&file).and_then(std::sync::Weak::upgrade) {
            return s;
        }
        let s = std::sync::Arc::new(Sessions::open(Some(file.clone())));
        open.insert(file, std::sync::Arc::downgrade(&s));
        s
    }

    /// Sessions kept in `file` (read now: the sessions of the last run
    /// that have not ended), or in memory only.
    pub fn open(file: Option<PathBuf>) -> Sessions {
        let mut table = Table::new();
        if let Some(f) = &file {
            match std::fs::read(f) {
                Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                    Ok(saved) if saved.version == 1 => {
                        let now = now_ms();
                        for s in saved.sessions.into_iter().filter(|s| s.ends_ms > now) {
                            if let (Some(id), Some(token)) = (unhex(&s.id_sha256), unhex(&s.token_sha256)) {
                                table.insert(id, (token, s.ends_ms));
                            }
                        }
                    }
                    Ok(saved) => {
                        tracing::warn!(file = %f.display(), version = saved.version, "sessions file of another version: everyone signs in again")
                    }
                    Err(e) => {
                        tracing::warn!(file = %f.display(), error = %e, "sessions file unreadable: everyone signs in again")
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %f.display(), error = %e, "cannot read the sessions file: everyone signs in again")
                }
            }
        }
        Sessions { table: Mutex::new(table), file }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start a session for `token` (already checked): the cookie's value.
    pub fn start(&self, token: &str) -> String {
        let id = hex::encode(rand::random::<[u8; 32]>());
        let token = digest(token);
        let now = now_ms();
        let mut t = self.lock();
        t.retain(|_, (_, end)| *end > now);
        let mut mine: Vec<(i64, [u8; 32])> =
            t.iter().filter(|(_, (d, _))| *d == token).map(|(k, (_, end))| (*end, *k)).collect();
        if mine.len() >= SESSIONS_PER_TOKEN {
            mine.sort();
            for (_, old) in mine.iter().take(mine.len() + 1 - SESSIONS_PER_TOKEN) {
                t.remove(old);
            }
        }
        t.insert(digest(&id), (token, now + SESSION_SECS as i64 * 1000));
        self.save(&t);
        id
    }

    /// End the session `id` names (logout).
    pub fn end(&self, id: &str) {
        let mut t = self.lock();
        if t.remove(&digest(id)).is_some() {
            self.save(&t);
        }
    }

    /// The token digest of a session that has not ended.
    pub fn token_of(&self, id: &str) -> Option<[u8; 32]> {
        let now = now_ms();
        self.lock().get(&digest(id)).filter(|(_, end)| *end > now).map(|(d, _)| *d)
    }

    /// Write the table whole (a temp file renamed over the old one); a
    /// failure is logged: sessions then last only until a restart.
    fn save(&self, t: &Table) {
        let Some(f) = &self.file else { return };
        let saved = Saved {
            version: 1,
            sessions: t
                .iter()
                .map(|(id, (token, end))| SavedSession {
                    id_sha256: hex::encode(id),
                    token_sha256: hex::encode(token),
                    ends_ms: *end,
                })
                .collect(),
        };
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let tmp = f.with_extension("json.tmp");
            let mut out = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            out.write_all(&serde_json::to_vec(&saved).unwrap_or_default())?;
            out.sync_all()?;
            std::fs::rename(&tmp, f)
        };
        if let Err(e) = write() {
            tracing::error!(file = %f.display(), error = %e, "cannot keep the sessions: they last until the engine restarts");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_outlive_a_restart_and_the_file_holds_no_session_id() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sessions.json");
        let s = Sessions::open(Some(file.clone()));
        let a = s.start("token-a");
        let b = s.start("token-b");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&a) && !text.contains("token-a"), "{text}");
        // Another engine life reads them back.
        let s2 = Sessions::open(Some(file.clone()));
        assert_eq!(s2.token_of(&a), Some(digest("token-a")));
        assert_eq!(s2.token_of(&b), Some(digest("token-b")));
        assert_eq!(s2.token_of("not-a-session"), None);
        // A logout is kept too.
        s2.end(&a);
        let s3 = Sessions::open(Some(file.clone()));
        assert_eq!(s3.token_of(&a), None);
        assert!(s3.token_of(&b).is_some());
        // A damaged file: nobody is signed in, nothing fails.
        std::fs::write(&file, "{not json").unwrap();
        assert_eq!(Sessions::open(Some(file)).token_of(&b), None);
    }

    #[test]
    fn one_token_holds_at_most_sixteen_sessions() {
        let s = Sessions::open(None);
        let ids: Vec<String> = (0..SESSIONS_PER_TOKEN + 2).map(|_| s.start("t")).collect();
        let live = ids.iter().filter(|id| s.token_of(id).is_some()).count();
        assert_eq!(live, SESSIONS_PER_TOKEN);
    }
}
