//! Who is asking: bearer tokens (or the UI's cookie holding one), stored as
//! SHA-256 hashes with a role, compared in constant time.

use axum::http::{HeaderMap, Method, StatusCode};
use nightshift_engine::config::{AuthConfig, Role};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The cookie the login page sets.
pub const COOKIE: &str = "nightshift_token";

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
}

impl Identity {
    /// Signed in through the login page (so there is a cookie to drop).
    pub fn has_session(&self) -> bool {
        self.via == Via::Cookie
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
}

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
        }
    }

    fn lookup(&self, token: &str) -> Option<(String, Role)> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare against every token, whatever matches, so the time taken
        // does not say which (or whether) one did.
        let mut found = None;
        for (name, role, h) in &self.tokens {
            if ct_eq(&digest, h) && found.is_none() {
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
        let cookies = headers.get(axum::http::header::COOKIE).and_then(|v| v.to_str().ok())?;
        cookies.split(';').find_map(|c| c.trim().strip_prefix(&format!("{COOKIE}=")).map(|t| (t.to_string(), true)))
    }

    /// Who is calling, if anyone.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Identity, ApiError> {
        match Self::token_from(headers) {
            Some((token, cookie)) => match self.lookup(&token) {
                Some((name, role)) => Ok(Identity { name, role, via: if cookie { Via::Cookie } else { Via::Bearer } }),
                None => Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the token is not valid")),
            },
            None => match self.anonymous {
                Some(role) => Ok(Identity { name: "anonymous".into(), role, via: Via::Anonymous }),
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
            Via::Cookie => !same_site(headers),
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
            None if self.anonymous.is_some() => Ok("anonymous".into()),
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
