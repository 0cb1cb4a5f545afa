//! Fuzz the endpoint URL policy: whatever URL it accepts must not lead a connection to a denied address.
//!
//! The input's first byte picks one of several operator policies; the rest is the URL. For every URL the policy
//! accepts, this target checks, with code independent of the implementation's tables and parsers:
//!
//! - the scheme is https (or http where allowed) and the port obeys the port allowlist;
//! - an IP-literal host is outside the deny list as STACK.md writes it (or inside the operator's allowlist);
//! - a domain host is not an IP literal in disguise: neither std's parser nor a C `inet_aton`-style reading
//!   (decimal, octal, hex, 1 to 4 parts, as `getaddrinfo` would take it) turns it into an address, and it is
//!   not a localhost name;
//! - the URL Herald stores and sends parses back to the same host and port (what is checked is what is used).

#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use herald_core::address::{AddressPolicy, TargetHost};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;

/// The deny list as STACK.md writes it, plus the documented extras: an independent copy.
const DENIED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "::/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    "::/8",
    "3fff::/20",
];

fn denied(ip: IpAddr) -> bool {
    DENIED
        .iter()
        .any(|n| n.parse::<IpNet>().is_ok_and(|net| net.contains(&ip)))
}

/// An IPv4-mapped or IPv4-compatible address's IPv4 part (where a dual-stack socket would connect).
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let mapped = o[..10].iter().all(|b| *b == 0) && o[10] == 0xff && o[11] == 0xff;
            let compatible = o[..12].iter().all(|b| *b == 0);
            (mapped || compatible).then(|| Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        IpAddr::V4(_) => None,
    }
}

/// A C-library reading of a host as an IPv4 address (glibc's `inet_aton`): 1 to 4 parts, each starting with a
/// digit and decimal, octal (leading 0) or hex (0x); the last part fills the remaining bytes.
fn inet_aton(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        // Like glibc, each part must start with a digit (Rust's integer parsers would also take a sign).
        if !part.bytes().next().is_some_and(|b| b.is_ascii_digit()) || !part.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return None;
        }
        let value = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            if hex.is_empty() {
                0
            } else {
                u64::from_str_radix(hex, 16).ok()?
            }
        } else if part.len() > 1 && part.starts_with('0') {
            u64::from_str_radix(&part[1..], 8).ok()?
        } else {
            part.parse::<u64>().ok()?
        };
        values.push(value);
    }
    let (last, init) = values.split_last()?;
    let mut addr: u64 = 0;
    for (i, v) in init.iter().enumerate() {
        if *v > 255 {
            return None;
        }
        addr |= v << (24 - 8 * i);
    }
    let room = 32 - 8 * init.len() as u32;
    if room < 64 && *last >= (1u64 << room) {
        return None;
    }
    Some(Ipv4Addr::from((addr | last) as u32))
}

struct Case {
    policy: AddressPolicy,
    allow: Vec<IpNet>,
    http: bool,
    ports: Vec<u16>,
}

fn case(selector: u8) -> Case {
    let (allow, http, ports): (Vec<IpNet>, bool, Vec<u16>) = match selector % 4 {
        0 => (vec![], false, vec![]),
        1 => (vec![], true, vec![]),
        2 => (vec!["127.0.0.0/8".parse().unwrap()], true, vec![]),
        _ => (vec![], true, vec![443, 8443]),
    };
    Case {
        policy: AddressPolicy::new(allow.clone(), http).with_allowed_ports(ports.clone()),
        allow,
        http,
        ports,
    }
}

fn allowlisted(case: &Case, ip: IpAddr) -> bool {
    let embedded = embedded_v4(ip).map(IpAddr::V4);
    case.allow
        .iter()
        .any(|net| net.contains(&ip) || embedded.is_some_and(|v4| net.contains(&v4)))
}

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(input) = std::str::from_utf8(rest) else { return };
    let case = case(*selector);
    // The raw input, and the input as a host (the commonest shape of a hostile endpoint URL).
    for url in [
        input.to_owned(),
        format!("http://{input}/hook"),
        format!("https://{input}"),
    ] {
        let Ok(target) = case.policy.check_url(&url) else {
            continue;
        };
        let scheme = target.url.scheme();
        assert!(
            scheme == "https" || (case.http && scheme == "http"),
            "{url:?}: scheme {scheme}"
        );
        assert_ne!(target.port, 0, "{url:?}");
        assert!(
            case.ports.is_empty() || case.ports.contains(&target.port),
            "{url:?}: port {}",
            target.port
        );
        match &target.host {
            TargetHost::Ip(ip) => {
                assert!(!denied(*ip) || allowlisted(&case, *ip), "{url:?} accepted denied {ip}");
                if let Some(v4) = embedded_v4(*ip) {
                    assert!(allowlisted(&case, IpAddr::V4(v4)), "{url:?} accepted embedded {v4}");
                }
            }
            TargetHost::Domain(name) => {
                assert!(
                    name.parse::<IpAddr>().is_err(),
                    "{url:?}: domain {name} is an IP literal"
                );
                let bare = name.trim_start_matches('[').trim_end_matches(']');
                assert!(
                    bare.parse::<IpAddr>().is_err(),
                    "{url:?}: domain {name} is an IP literal"
                );
                if let Some(v4) = inet_aton(name) {
                    panic!("{url:?}: domain {name} reads as {v4} to a C resolver");
                }
                assert!(!name.is_empty() && !name.ends_with('.'), "{url:?}: {name}");
                let localhost = name == "localhost" || name.ends_with(".localhost");
                assert!(
                    !localhost || allowlisted(&case, IpAddr::V4(Ipv4Addr::LOCALHOST)),
                    "{url:?}"
                );
            }
        }
        // What is stored and sent reads back as what was checked.
        let again = case
            .policy
            .check_url(target.url.as_str())
            .expect("the canonical URL is accepted again");
        assert_eq!(again.host, target.host, "{url:?}");
        assert_eq!(again.port, target.port, "{url:?}");
    }
});
