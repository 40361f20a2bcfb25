//! `auth.proxy`: single sign-on through an authenticating proxy — the
//! headers it sets, the addresses it connects from (IPs and CIDRs, and the
//! match of a peer against them), and the roles its groups give.

use serde::{Deserialize, Serialize};

use super::Role;

/// `auth.proxy`: who a trusted authenticating proxy says is asking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyAuth {
    /// The header the proxy sets to the signed-in person's name.
    #[serde(default = "proxy_user_header")]
    pub user_header: String,
    /// The header with the person's groups, comma-separated.
    #[serde(default = "proxy_groups_header")]
    pub groups_header: String,
    /// Addresses the proxy connects from (an IP or a CIDR such as
    /// 10.0.0.0/24). A request from anywhere else that carries either
    /// header is refused.
    pub from: Vec<String>,
    /// Group → role; a person gets the highest role among their groups.
    #[serde(default)]
    pub roles: std::collections::BTreeMap<String, Role>,
    /// The role of a person in none of those groups; absent: refused.
    #[serde(default)]
    pub default_role: Option<Role>,
}

fn proxy_user_header() -> String {
    "X-Forwarded-User".into()
}

fn proxy_groups_header() -> String {
    "X-Forwarded-Groups".into()
}

/// `10.0.0.0/24`, `::1/128` or a bare address (a whole /32 or /128).
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (ip, bits) = match s.trim().split_once('/') {
        Some((ip, bits)) => (ip.parse::<std::net::IpAddr>().ok()?, bits.parse::<u8>().ok()?),
        None => {
            let ip = s.trim().parse::<std::net::IpAddr>().ok()?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

/// Whether `ip` is inside `net/bits` (an IPv4-mapped IPv6 address counts
/// as its IPv4 address).
pub fn in_cidr(ip: std::net::IpAddr, net: std::net::IpAddr, bits: u8) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_inside_the_proxys_addresses_or_not() {
        let cases = [
            ("10.0.0.5", "10.0.0.5", true),
            ("10.0.0.5", "10.0.0.6", false),
            ("10.0.0.0/24", "10.0.0.200", true),
            ("10.0.0.0/24", "10.0.1.1", false),
            ("0.0.0.0/0", "192.0.2.1", true),
            ("fd00::/64", "fd00::7", true),
            ("fd00::/64", "fd01::7", false),
            // An IPv4 peer on a dual-stack socket.
            ("10.0.0.5", "::ffff:10.0.0.5", true),
            ("10.0.0.5", "::1", false),
        ];
        for (net, ip, want) in cases {
            let (n, bits) = parse_cidr(net).unwrap();
            assert_eq!(in_cidr(ip.parse().unwrap(), n, bits), want, "{ip} in {net}");
        }
        for bad in ["10.0.0.0/33", "fd00::/129", "ten", "10.0.0.0/x", ""] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }
}
