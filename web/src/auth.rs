//! Who is asking: bearer tokens (or the UI's session cookie), stored as
//! SHA-256 hashes with a role, compared in constant time; or, with
//! `auth.proxy`, the person a trusted authenticating proxy names in a
//! header, their role from their groups (single sign-on through the site's
//! identity provider, as Grafana's auth proxy; `sso.rs` refuses the header
//! from any address but the proxy's). The login page turns a token into a
//! session (`sessions.rs`: kept across restarts, never the token itself).
//!
//! Anonymous mode (a loopback demo) answers only requests addressed to a
//! loopback host: a page on another site that rebinds its own name to
//! 127.0.0.1 (DNS rebinding) still sends its own name as `Host`.

use std::sync::Arc;

use axum::http::{HeaderMap, Method, StatusCode};
use nightshift_engine::config::{AuthConfig, ProxyAuth, Role};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::sessions::Sessions;

/// The cookie the login page sets: a session id.
pub const COOKIE: &str = "nightshift_session";

pub use crate::sessions::{SESSION_SECS, SESSIONS_PER_TOKEN};

/// The session cookie's attributes: same-site, HTTP-only, and `Secure`
/// where the engine is reached over HTTPS (`auth.secure_cookies`).
pub fn cookie_attrs(secure: bool) -> &'static str {
    if secure { "Path=/; HttpOnly; SameSite=Strict; Secure" } else { "Path=/; HttpOnly; SameSite=Strict" }
}

/// A login posted from another site's page (login CSRF: the other site
/// logs the victim's browser in as the attacker, whose audit trail then
/// holds the victim's approvals): refused.
pub fn login_from_another_site(headers: &HeaderMap) -> bool {
    cross_site(headers)
}

/// End the session a request's cookie names (logout) — whatever else the
/// request carries: an `Authorization` header beside the cookie used to
/// leave the session valid.
pub fn end_session(sessions: &Sessions, headers: &HeaderMap) {
    if let Some(id) = Auth::cookie_from(headers) {
        sessions.end(&id);
    }
}

/// Whether `Host` names this machine's loopback (what anonymous mode
/// answers): `localhost`, `127.x.x.x` or `[::1]`, with any port. No `Host`
/// (HTTP/1.0 tools) counts as loopback: browsers always send one.
fn loopback_host(headers: &HeaderMap) -> Result<(), String> {
    let Some(host) = headers.get(axum::http::header::HOST) else { return Ok(()) };
    let host = host.to_str().map_err(|_| "a Host header that is not text".to_string())?;
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    let ok =
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if ok { Ok(()) } else { Err(format!("Host: {host}")) }
}

/// A caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub name: String,
    pub role: Role,
    pub via: Via,
}

/// How a caller identified itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `Authorization: Bearer …`: a page on another site cannot send it.
    Bearer,
    /// The UI's login cookie: a browser sends it by itself.
    Cookie,
    /// Nothing, in anonymous mode: any page the browser visits can do that.
    Anonymous,
    /// The authenticating proxy's header: the proxy adds it to whatever the
    /// browser sends, so it counts as a cookie does.
    Proxy,
}

impl Identity {
    /// Signed in through the login page (so there is a cookie to drop).
    pub fn has_session(&self) -> bool {
        self.via == Via::Cookie
    }

    /// Who this is, for a standby forwarding its request to the leader
    /// (`PEER_AS`): a token's holder by name (the leader gives the name its
    /// own role), the proxy's person with the role their groups gave here.
    pub fn peer_as(&self) -> String {
        match self.via {
            Via::Anonymous => "anonymous".to_string(),
            Via::Proxy => format!("sso {} {}", self.name, role_word(self.role)),
            Via::Bearer | Via::Cookie => format!("user {}", self.name),
        }
    }

    /// `user:<name>` for the audit log.
    pub fn actor(&self) -> String {
        format!("user:{}", self.name)
    }
}

/// The configured tokens.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Vec<(String, Role, [u8; 32])>,
    /// Webhook tokens by name.
    webhooks: Vec<(String, [u8; 32])>,
    anonymous: Option<Role>,
    /// The digest of the secret the engines of an HA shard share: a
    /// request carrying it says who asked ([`PEER_AS`]), checked by the
    /// standby that forwarded it.
    peer: Option<[u8; 32]>,
    /// The sign-in sessions this engine keeps.
    sessions: Arc<Sessions>,
    /// `auth.proxy`: the authenticating proxy's headers and group roles.
    proxy: Option<ProxyAuth>,
}

fn role_word(r: Role) -> &'static str {
    match r {
        Role::Viewer => "viewer",
        Role::Operator => "operator",
        Role::Admin => "admin",
    }
}

/// The engines' shared secret, on a forwarded request.
pub const PEER_SECRET: &str = "x-nightshift-peer";
/// Who asked, on a forwarded request: `user NAME`, `anonymous` or
/// `webhook NAME` (what the standby checked).
pub const PEER_AS: &str = "x-nightshift-as";

fn decode(hex_str: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    if let Ok(v) = hex::decode(hex_str)
        && v.len() == 32
    {
        out.copy_from_slice(&v);
    }
    out
}

/// Constant-time equality of two digests.
pub fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= a[i] ^ b[i];
    }
    diff == 0
}

/// SHA-256 of a token, hex (what the config stores).
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Auth {
    pub fn new(cfg: &AuthConfig) -> Auth {
        Auth {
            tokens: cfg.tokens.iter().map(|t| (t.name.clone(), t.role, decode(&t.sha256))).collect(),
            webhooks: cfg
                .webhook_token_sha256
                .iter()
                .map(|h| ("alertmanager".to_string(), decode(h)))
                .chain(cfg.webhook_tokens.iter().map(|w| (w.name.clone(), decode(&w.sha256))))
                .collect(),
            anonymous: cfg.allow_anonymous,
            peer: None,
            sessions: Arc::new(Sessions::open(None)),
            proxy: cfg.proxy.clone(),
        }
    }

    /// The same, with the engine's sessions.
    pub fn with_sessions(mut self, sessions: Arc<Sessions>) -> Auth {
        self.sessions = sessions;
        self
    }

    /// The engine's sessions (login and logout open and end them).
    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    /// `auth.proxy`, when set.
    pub fn proxy(&self) -> Option<&ProxyAuth> {
        self.proxy.as_ref()
    }

    /// The person the proxy's header names, and the role of their groups
    /// (none: no header). `sso.rs` has already refused the header from an
    /// address that is not the proxy's.
    fn proxy_identity(&self, headers: &HeaderMap) -> Option<Result<Identity, ApiError>> {
        let p = self.proxy.as_ref()?;
        let user = headers.get(p.user_header.as_str())?;
        let refused = |m: String| ApiError::new(StatusCode::FORBIDDEN, "forbidden", m);
        let name = match user.to_str().map(str::trim) {
            Ok(n) if !n.is_empty() && n.len() <= 128 && n.chars().all(|c| c.is_ascii_graphic() && c != ',') => n,
            _ => {
                return Some(Err(refused(format!(
                    "{}: expected a person's name (printable, no spaces, at most 128 characters), found {user:?}",
                    p.user_header
                ))));
            }
        };
        let groups: Vec<&str> = headers
            .get_all(p.groups_header.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .collect();
        let role = groups.iter().filter_map(|g| p.roles.get(*g).copied()).max().or(p.default_role);
        Some(match role {
            Some(role) => Ok(Identity { name: name.to_string(), role, via: Via::Proxy }),
            None => Err(refused(format!(
                "{name} is in none of the groups auth.proxy.roles names ({}), found groups [{}]: ask an admin to add one",
                p.roles.keys().cloned().collect::<Vec<_>>().join(", "),
                groups.join(", ")
            ))),
        })
    }

    /// The same, taking requests forwarded by the engines that share
    /// `secret`.
    pub fn with_peer_secret(mut self, secret: Option<&str>) -> Auth {
        self.peer = secret.map(|s| Sha256::digest(s.as_bytes()).into());
        self
    }

    /// A forwarded request: who the standby says asked, if the request
    /// carries the engines' secret (`Err` if it carries a wrong one).
    fn forwarded_as(&self, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
        let Some(secret) = headers.get(PEER_SECRET) else { return Ok(None) };
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let Some(peer) = &self.peer else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a forwarded request, and this engine takes none: set audit.postgres.peer_token_file on every engine of the shard",
            ));
        };
        if !ct_eq(&digest, peer) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the engines' shared secret is not valid",
            ));
        }
        let who = headers.get(PEER_AS).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        Ok(Some(who))
    }

    fn lookup(&self, token: &str) -> Option<(String, Role)> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.lookup_digest(&digest)
    }

    fn lookup_digest(&self, digest: &[u8; 32]) -> Option<(String, Role)> {
        // Compare against every token, whatever matches, so the time taken
        // does not say which (or whether) one did.
        let mut found = None;
        for (name, role, h) in &self.tokens {
            if ct_eq(digest, h) && found.is_none() {
                found = Some((name.clone(), *role));
            }
        }
        found
    }

    fn token_from(headers: &HeaderMap) -> Option<(String, bool)> {
        if let Some(v) = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok())
            && let Some(t) = v.strip_prefix("Bearer ")
        {
            return Some((t.trim().to_string(), false));
        }
        Auth::cookie_from(headers).map(|t| (t, true))
    }

    /// The session id the request's cookie carries.
    fn cookie_from(headers: &HeaderMap) -> Option<String> {
        let cookies = headers.get(axum::http::header::COOKIE).and_then(|v| v.to_str().ok())?;
        cookies.split(';').find_map(|c| c.trim().strip_prefix(&format!("{COOKIE}=")).map(str::to_string))
    }

    /// Who is calling, if anyone.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Identity, ApiError> {
        if let Some(who) = self.forwarded_as(headers)? {
            // A standby checked the caller; the role is this engine's own
            // for that name.
            let refused = || {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    format!("a forwarded request for {who:?}, who has no token here"),
                )
            };
            return match who.split_once(' ') {
                // The proxy's person: the standby mapped their groups with
                // the same auth.proxy; their role comes with the name.
                Some(("sso", rest)) if self.proxy.is_some() => match rest.rsplit_once(' ') {
                    Some((name, role)) => {
                        let role = match role {
                            "viewer" => Role::Viewer,
                            "operator" => Role::Operator,
                            "admin" => Role::Admin,
                            _ => return Err(refused()),
                        };
                        Ok(Identity { name: name.to_string(), role, via: Via::Bearer })
                    }
                    None => Err(refused()),
                },
                Some(("user", name)) => {
                    let role =
                        self.tokens.iter().find(|(n, _, _)| n == name).map(|(_, r, _)| *r).ok_or_else(refused)?;
                    Ok(Identity { name: name.to_string(), role, via: Via::Bearer })
                }
                None if who == "anonymous" => match self.anonymous {
                    Some(role) => Ok(Identity { name: "anonymous".into(), role, via: Via::Bearer }),
                    None => Err(refused()),
                },
                _ => Err(refused()),
            };
        }
        // A bearer token first (a script through the proxy), then the
        // proxy's person, then a session, then anonymous.
        if !matches!(Self::token_from(headers), Some((_, false)))
            && let Some(id) = self.proxy_identity(headers)
        {
            return id;
        }
        match Self::token_from(headers) {
            Some((token, false)) => match self.lookup(&token) {
                Some((name, role)) => Ok(Identity { name, role, via: Via::Bearer }),
                None => Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the token is not valid")),
            },
            Some((session, true)) => {
                let digest = self.sessions.token_of(&session);
                match digest.and_then(|d| self.lookup_digest(&d)) {
                    Some((name, role)) => Ok(Identity { name, role, via: Via::Cookie }),
                    None => Err(ApiError::new(
                        StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "the session has ended (logged out, expired, the engine restarted or its token was removed): log in again on /login",
                    )),
                }
            }
            None => match self.anonymous {
                Some(role) => {
                    loopback_host(headers).map_err(|found| {
                        ApiError::new(
                            StatusCode::FORBIDDEN,
                            "not_loopback",
                            format!(
                                "anonymous mode answers only requests addressed to this machine's loopback (Host: 127.0.0.1, [::1] or localhost), found {found}: send a token, or open the UI at http://127.0.0.1:PORT"
                            ),
                        )
                    })?;
                    Ok(Identity { name: "anonymous".into(), role, via: Via::Anonymous })
                }
                None => Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "a token is required: send `Authorization: Bearer <token>` (or log in on /login)",
                )),
            },
        }
    }

    /// The caller, if they hold at least `role`; state-changing requests made
    /// with the UI cookie must come from this site.
    pub fn require(&self, headers: &HeaderMap, method: &Method, role: Role) -> Result<Identity, ApiError> {
        let id = self.identify(headers)?;
        if id.role < role {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("this needs the {role:?} role; {} has {:?}", id.name, id.role).to_lowercase(),
            ));
        }
        // A credential the browser sends by itself must come from our own
        // pages: the cookie must prove it (same-origin); no credential at
        // all (anonymous mode) must at least not come from another site
        // (browsers always say so; curl and scripts say nothing).
        let refused = match id.via {
            Via::Bearer => false,
            Via::Cookie | Via::Proxy => !same_site(headers),
            Via::Anonymous => cross_site(headers),
        };
        if refused && method != Method::GET {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "cross_site",
                "state-changing requests must come from this site",
            ));
        }
        Ok(id)
    }

    /// Who posts to the Alertmanager webhook: the name of a webhook token
    /// (`auth.webhook_tokens`). User tokens are refused — a person's token
    /// posting alerts would let them trigger, and then approve, runs — and so
    /// is any body not sent as `application/json`, which a web page cannot
    /// send across sites without a preflight the server never answers. Only
    /// an anonymous loopback demo takes a webhook call without a token.
    pub fn require_webhook(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        let ct = headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !ct.trim_start().to_ascii_lowercase().starts_with("application/json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("the webhook takes `Content-Type: application/json` (as Alertmanager sends), found {ct:?}"),
            ));
        }
        if let Some(who) = self.forwarded_as(headers)? {
            return match who.strip_prefix("webhook ") {
                Some(name) if self.webhooks.iter().any(|(n, _)| n == name) => Ok(name.to_string()),
                Some("anonymous") if self.anonymous.is_some() => Ok("anonymous".into()),
                _ => Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    format!("a forwarded webhook call for {who:?}, which has no webhook token here"),
                )),
            };
        }
        let token = Self::token_from(headers).filter(|(_, cookie)| !cookie).map(|(t, _)| t);
        match token {
            Some(t) => {
                let digest: [u8; 32] = Sha256::digest(t.as_bytes()).into();
                let mut found = None;
                for (name, h) in &self.webhooks {
                    if ct_eq(&digest, h) && found.is_none() {
                        found = Some(name.clone());
                    }
                }
                if let Some(name) = found {
                    return Ok(name);
                }
                if self.lookup(&t).is_some() {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        "the webhook takes a webhook token (auth.webhook_tokens), not a person's token: make one with `nightshift token --webhook NAME`",
                    ));
                }
                Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the token is not valid"))
            }
            None if self.anonymous.is_some() => {
                loopback_host(headers).map_err(|found| {
                    ApiError::new(
                        StatusCode::FORBIDDEN,
                        "not_loopback",
                        format!("anonymous mode takes webhook calls only addressed to this machine's loopback, found {found}"),
                    )
                })?;
                Ok("anonymous".into())
            }
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the webhook needs `Authorization: Bearer <webhook token>` (Alertmanager: http_config.authorization)",
            )),
        }
    }
}

/// A request that came from our own pages: `Sec-Fetch-Site: same-origin`,
/// or an `Origin` whose host is this `Host`.
fn same_site(headers: &HeaderMap) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site == "same-origin";
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => origin.split("://").nth(1) == Some(host),
        _ => false,
    }
}

/// A request a browser made for a page of another site (another origin,
/// another port included): `Sec-Fetch-Site` other than `same-origin` or
/// `none`, or an `Origin` whose host is not this `Host`.
fn cross_site(headers: &HeaderMap) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site != "same-origin" && site != "none";
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => origin.split("://").nth(1) != Some(host),
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 27 item 10: anonymous mode had no Host check, so a
    /// page whose name was rebound to 127.0.0.1 could start runs): only a
    /// loopback Host is answered anonymously; a token is answered anywhere.
    #[test]
    fn anonymous_mode_answers_only_a_loopback_host() {
        let auth = Auth::new(&AuthConfig { allow_anonymous: Some(Role::Operator), ..AuthConfig::default() });
        let with_host = |h: &str| {
            let mut m = HeaderMap::new();
            m.insert("host", h.parse().unwrap());
            m
        };
        for (host, ok) in [
            ("127.0.0.1:8080", true),
            ("localhost:8080", true),
            ("LOCALHOST", true),
            ("[::1]:8080", true),
            ("127.1.2.3", true),
            ("evil.example:8080", false),
            ("localhost.evil.example", false),
            ("10.0.0.1:8080", false),
            ("[::ffff:10.0.0.1]:8080", false),
        ] {
            let r = auth.identify(&with_host(host));
            assert_eq!(r.is_ok(), ok, "{host}: {r:?}");
            if !ok {
                let e = r.unwrap_err();
                assert_eq!(e.status, StatusCode::FORBIDDEN);
                assert!(e.message.contains(&format!("found Host: {host}")), "{}", e.message);
            }
        }
        assert!(auth.identify(&HeaderMap::new()).is_ok(), "no Host (HTTP/1.0 tools)");
    }

    #[test]
    fn a_session_holds_the_tokens_digest_and_ends_with_the_token() {
        let cfg = |tokens: Vec<nightshift_engine::config::TokenSpec>| AuthConfig { tokens, ..AuthConfig::default() };
        let token = nightshift_engine::config::TokenSpec {
            name: "ana".into(),
            role: Role::Operator,
            sha256: hash_token("s3cret"),
        };
        let auth = Auth::new(&cfg(vec![token]));
        let id = auth.sessions().start("s3cret");
        assert!(!id.contains("s3cret") && id.len() == 64);
        let mut h = HeaderMap::new();
        h.insert("cookie", format!("{COOKIE}={id}").parse().unwrap());
        let who = auth.identify(&h).unwrap();
        assert_eq!((who.name.as_str(), who.via), ("ana", Via::Cookie));
        // The token itself is no session.
        let mut raw = HeaderMap::new();
        raw.insert("cookie", format!("{COOKIE}=s3cret").parse().unwrap());
        assert_eq!(auth.identify(&raw).unwrap_err().status, StatusCode::UNAUTHORIZED);
        // A reload that removed the token ends its sessions.
        let reloaded = Auth::new(&cfg(vec![])).with_sessions(auth.sessions().clone());
        assert_eq!(reloaded.identify(&h).unwrap_err().status, StatusCode::UNAUTHORIZED);
        end_session(auth.sessions(), &h);
        assert_eq!(auth.identify(&h).unwrap_err().status, StatusCode::UNAUTHORIZED, "logged out");
    }

    #[test]
    fn cross_site_requests_are_told_from_ours_and_from_scripts() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        let host = ("host", "127.0.0.1:8080");
        for (headers, cross, same) in [
            (h(&[host, ("sec-fetch-site", "same-origin")]), false, true),
            // Another port on the same host is another origin.
            (h(&[host, ("sec-fetch-site", "same-site")]), true, false),
            (h(&[host, ("sec-fetch-site", "cross-site")]), true, false),
            (h(&[host, ("origin", "http://127.0.0.1:9999")]), true, false),
            (h(&[host, ("origin", "http://127.0.0.1:8080")]), false, true),
            // curl, a script: says nothing; fine without a credential the
            // browser sends by itself, not enough for a cookie.
            (h(&[host]), false, false),
        ] {
            assert_eq!(cross_site(&headers), cross, "{headers:?}");
            assert_eq!(same_site(&headers), same, "{headers:?}");
        }
    }

    /// `ct_eq` reads all 32 bytes whatever differs (no early exit: the loop
    /// has no branch on the data), and tells every single-byte and
    /// single-bit difference apart from equality.
    #[test]
    fn digest_comparison_sees_every_byte() {
        let a: [u8; 32] = Sha256::digest(b"token").into();
        assert!(ct_eq(&a, &a));
        for i in 0..32 {
            for bit in 0..8 {
                let mut b = a;
                b[i] ^= 1 << bit;
                assert!(!ct_eq(&a, &b), "byte {i} bit {bit}");
            }
        }
        assert_eq!(hash_token("token"), hex::encode(a));
    }
}
