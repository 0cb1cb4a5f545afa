//! The SSRF address policy: which endpoint URLs and which IP addresses Herald may connect to.
//!
//! An endpoint URL is chosen by whoever registers the endpoint, so it is hostile input: without a check, Herald
//! would happily POST signed payloads to its own admin port, the cloud metadata service at 169.254.169.254, or
//! anything else on the private network it runs in (DESIGN.md §1.7, "The URL is hostile").
//!
//! This module is the *pure* half of the defence. It never does I/O:
//!
//! - [`AddressPolicy::check_url`] vets a URL at registration time and before every attempt: scheme, host shape,
//!   IP-literal hosts and the `localhost` names. IP-literal hosts must be checked here because reqwest/hyper never
//!   call a custom resolver for them.
//! - [`AddressPolicy::check_ip`] vets one address. The SSRF-safe resolver in `herald-delivery` calls it on every
//!   address a domain resolves to, drops the denied ones and pins the connection to a vetted one (so DNS rebinding
//!   cannot swap the address after the check).
//!
//! The deny list is written out explicitly (std's `IpAddr::is_global` is unstable) as a static table, see
//! [`DenyRule::ranges`]. When several ranges match, the longest prefix names the rule, so `255.255.255.255` is
//! [`DenyRule::Broadcast`] rather than [`DenyRule::Reserved`] and `::1` is [`DenyRule::Loopback`] rather than
//! [`DenyRule::Ipv4Compatible`].
//!
//! IPv6 forms that carry an IPv4 address ([`DenyRule::embeds_ipv4`]) are denied as a whole, and their embedded
//! IPv4 address is checked too, so that the reported rule names the real target: `::ffff:10.0.0.1` is reported
//! as private-use (10.0.0.0/8), not merely as IPv4-mapped.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use url::{Host, Url};

/// Builds an IPv4 CIDR in a `const` context (the deny table is static).
const fn v4(a: u8, b: u8, c: u8, d: u8, prefix_len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix_len))
}

/// Builds an IPv6 CIDR from its eight 16-bit segments in a `const` context.
const fn v6(s: [u16; 8], prefix_len: u8) -> IpNet {
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        prefix_len,
    ))
}

const UNSPECIFIED: &[IpNet] = &[v4(0, 0, 0, 0, 32), v6([0, 0, 0, 0, 0, 0, 0, 0], 128)];
const THIS_NETWORK: &[IpNet] = &[v4(0, 0, 0, 0, 8)];
const PRIVATE: &[IpNet] = &[v4(10, 0, 0, 0, 8), v4(172, 16, 0, 0, 12), v4(192, 168, 0, 0, 16)];
const SHARED_ADDRESS_SPACE: &[IpNet] = &[v4(100, 64, 0, 0, 10)];
const LOOPBACK: &[IpNet] = &[v4(127, 0, 0, 0, 8), v6([0, 0, 0, 0, 0, 0, 0, 1], 128)];
const LINK_LOCAL: &[IpNet] = &[v4(169, 254, 0, 0, 16), v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10)];
const IETF_PROTOCOL: &[IpNet] = &[v4(192, 0, 0, 0, 24), v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23)];
const DOCUMENTATION: &[IpNet] = &[
    v4(192, 0, 2, 0, 24),
    v4(198, 51, 100, 0, 24),
    v4(203, 0, 113, 0, 24),
    v6([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
];
const BENCHMARKING: &[IpNet] = &[v4(198, 18, 0, 0, 15), v6([0x2001, 0x0002, 0, 0, 0, 0, 0, 0], 48)];
const SIX_TO_FOUR_RELAY_ANYCAST: &[IpNet] = &[v4(192, 88, 99, 0, 24)];
const MULTICAST: &[IpNet] = &[v4(224, 0, 0, 0, 4), v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8)];
const RESERVED: &[IpNet] = &[v4(240, 0, 0, 0, 4), v6([0, 0, 0, 0, 0, 0, 0, 0], 8)];
const BROADCAST: &[IpNet] = &[v4(255, 255, 255, 255, 32)];
const UNIQUE_LOCAL: &[IpNet] = &[v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7)];
const SITE_LOCAL: &[IpNet] = &[v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10)];
const IPV4_MAPPED: &[IpNet] = &[v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96)];
const IPV4_COMPATIBLE: &[IpNet] = &[v6([0, 0, 0, 0, 0, 0, 0, 0], 96)];
const NAT64: &[IpNet] = &[
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
];
const SIX_TO_FOUR: &[IpNet] = &[v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16)];
const TEREDO: &[IpNet] = &[v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32)];
const DISCARD: &[IpNet] = &[v6([0x0100, 0, 0, 0, 0, 0, 0, 0], 64)];

/// The IPv4 address `localhost` stands for; allowlisting it is what lets `localhost` URLs through.
const LOCALHOST_V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Why an address is denied: one variant per named family of special-purpose ranges (IANA IPv4/IPv6
/// Special-Purpose Address Registries, RFC 6890 and successors).
///
/// The variants are families rather than single CIDRs so that logs, metrics and API errors can group them with a
/// stable code ([`DenyRule::name`]); the exact CIDR that matched is carried by [`AddressDenied`]'s `Display` and
/// [`AddressDenied::cidr`]. `Display` on the rule itself lists every CIDR of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyRule {
    /// `0.0.0.0/32`, `::/128`: "any address"; connecting to it reaches the local host on most stacks.
    Unspecified,
    /// `0.0.0.0/8`: "this host on this network" (RFC 791/1122); Linux routes it to the local host.
    ThisNetwork,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`: private-use networks (RFC 1918), the classic SSRF target.
    Private,
    /// `100.64.0.0/10`: shared address space for carrier-grade NAT (RFC 6598); also used by cloud providers for
    /// internal services (e.g. Alibaba's metadata service at 100.100.100.200).
    SharedAddressSpace,
    /// `127.0.0.0/8`, `::1/128`: the local host itself, including Herald's own listeners.
    Loopback,
    /// `169.254.0.0/16`, `fe80::/10`: link-local, home of the cloud metadata services (169.254.169.254).
    LinkLocal,
    /// `192.0.0.0/24`, `2001::/23` (outside the more specific Teredo/benchmarking ranges): IETF protocol
    /// assignments (DS-Lite, NAT64 discovery, PCP/TURN anycast, AMT, ORCHID …); not ordinary destinations.
    IetfProtocol,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`: documentation only
    /// (RFC 5737, 3849, 9637); never routed, so a URL using them is a mistake or a probe.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`: network benchmarking (RFC 2544, 5180), frequently used for lab-internal
    /// devices.
    Benchmarking,
    /// `192.88.99.0/24`: the deprecated 6to4 relay anycast prefix (RFC 7526); traffic to it is tunnelled to
    /// unknown relays.
    SixToFourRelayAnycast,
    /// `224.0.0.0/4`, `ff00::/8`: multicast; an HTTP endpoint cannot be a group address.
    Multicast,
    /// `240.0.0.0/4` (class E), `::/8` (reserved by the IETF, outside the more specific forms): not allocated for
    /// ordinary unicast.
    Reserved,
    /// `255.255.255.255/32`: limited broadcast.
    Broadcast,
    /// `fc00::/7`: IPv6 unique local addresses (RFC 4193), the IPv6 counterpart of private-use (AWS serves its
    /// IPv6 metadata service at `fd00:ec2::254`).
    UniqueLocal,
    /// `fec0::/10`: deprecated IPv6 site-local addresses (RFC 3879), still routed internally by some networks.
    SiteLocal,
    /// `::ffff:0:0/96`: IPv4-mapped IPv6 addresses. A dual-stack socket connects to the embedded IPv4 address,
    /// so this form would smuggle any IPv4 target past an IPv4-only check. Resolvers should unmap such answers
    /// (`IpAddr::to_canonical`) before checking them; a URL should use the IPv4 literal.
    Ipv4Mapped,
    /// `::/96`: deprecated IPv4-compatible IPv6 addresses (RFC 4291), an older spelling of the same trick.
    Ipv4Compatible,
    /// `64:ff9b::/96`, `64:ff9b:1::/48`: NAT64 prefixes (RFC 6052, 8215); a NAT64 gateway forwards to the
    /// embedded IPv4 address, which may be internal.
    Nat64,
    /// `2002::/16`: 6to4 (RFC 3056); the embedded IPv4 address is the tunnel endpoint that receives the traffic.
    SixToFour,
    /// `2001::/32`: Teredo (RFC 4380); tunnels through embedded IPv4 server/client addresses to hosts behind NAT.
    Teredo,
    /// `100::/64`: discard-only (RFC 6666); traffic to it is black-holed by design.
    Discard,
}

impl DenyRule {
    /// Every rule, in declaration order, so tests and documentation can enumerate the whole deny list.
    pub const ALL: [DenyRule; 21] = [
        DenyRule::Unspecified,
        DenyRule::ThisNetwork,
        DenyRule::Private,
        DenyRule::SharedAddressSpace,
        DenyRule::Loopback,
        DenyRule::LinkLocal,
        DenyRule::IetfProtocol,
        DenyRule::Documentation,
        DenyRule::Benchmarking,
        DenyRule::SixToFourRelayAnycast,
        DenyRule::Multicast,
        DenyRule::Reserved,
        DenyRule::Broadcast,
        DenyRule::UniqueLocal,
        DenyRule::SiteLocal,
        DenyRule::Ipv4Mapped,
        DenyRule::Ipv4Compatible,
        DenyRule::Nat64,
        DenyRule::SixToFour,
        DenyRule::Teredo,
        DenyRule::Discard,
    ];

    /// A stable snake_case code for logs, metrics labels and machine-readable API errors. These strings are part
    /// of Herald's observable interface: do not rename them.
    pub fn name(&self) -> &'static str {
        match self {
            DenyRule::Unspecified => "unspecified",
            DenyRule::ThisNetwork => "this_network",
            DenyRule::Private => "private",
            DenyRule::SharedAddressSpace => "shared_address_space",
            DenyRule::Loopback => "loopback",
            DenyRule::LinkLocal => "link_local",
            DenyRule::IetfProtocol => "ietf_protocol",
            DenyRule::Documentation => "documentation",
            DenyRule::Benchmarking => "benchmarking",
            DenyRule::SixToFourRelayAnycast => "six_to_four_relay_anycast",
            DenyRule::Multicast => "multicast",
            DenyRule::Reserved => "reserved",
            DenyRule::Broadcast => "broadcast",
            DenyRule::UniqueLocal => "unique_local",
            DenyRule::SiteLocal => "site_local",
            DenyRule::Ipv4Mapped => "ipv4_mapped",
            DenyRule::Ipv4Compatible => "ipv4_compatible",
            DenyRule::Nat64 => "nat64",
            DenyRule::SixToFour => "six_to_four",
            DenyRule::Teredo => "teredo",
            DenyRule::Discard => "discard",
        }
    }

    /// A short human-readable description ("loopback", "private-use", …) used in user-facing messages.
    pub fn description(&self) -> &'static str {
        match self {
            DenyRule::Unspecified => "the unspecified address",
            DenyRule::ThisNetwork => "\"this network\"",
            DenyRule::Private => "private-use",
            DenyRule::SharedAddressSpace => "shared address space (carrier-grade NAT)",
            DenyRule::Loopback => "loopback",
            DenyRule::LinkLocal => "link-local",
            DenyRule::IetfProtocol => "an IETF protocol assignment",
            DenyRule::Documentation => "documentation-only",
            DenyRule::Benchmarking => "benchmarking",
            DenyRule::SixToFourRelayAnycast => "6to4 relay anycast",
            DenyRule::Multicast => "multicast",
            DenyRule::Reserved => "reserved",
            DenyRule::Broadcast => "broadcast",
            DenyRule::UniqueLocal => "unique local (IPv6 private)",
            DenyRule::SiteLocal => "site-local",
            DenyRule::Ipv4Mapped => "IPv4-mapped IPv6",
            DenyRule::Ipv4Compatible => "IPv4-compatible IPv6",
            DenyRule::Nat64 => "NAT64",
            DenyRule::SixToFour => "6to4",
            DenyRule::Teredo => "Teredo",
            DenyRule::Discard => "discard-only",
        }
    }

    /// The CIDRs this rule denies: the deny list, written out. A rule may also apply to addresses inside a
    /// broader range of another rule (e.g. [`DenyRule::Teredo`] inside [`DenyRule::IetfProtocol`]'s
    /// `2001::/23`); the longest matching prefix wins.
    pub fn ranges(&self) -> &'static [IpNet] {
        match self {
            DenyRule::Unspecified => UNSPECIFIED,
            DenyRule::ThisNetwork => THIS_NETWORK,
            DenyRule::Private => PRIVATE,
            DenyRule::SharedAddressSpace => SHARED_ADDRESS_SPACE,
            DenyRule::Loopback => LOOPBACK,
            DenyRule::LinkLocal => LINK_LOCAL,
            DenyRule::IetfProtocol => IETF_PROTOCOL,
            DenyRule::Documentation => DOCUMENTATION,
            DenyRule::Benchmarking => BENCHMARKING,
            DenyRule::SixToFourRelayAnycast => SIX_TO_FOUR_RELAY_ANYCAST,
            DenyRule::Multicast => MULTICAST,
            DenyRule::Reserved => RESERVED,
            DenyRule::Broadcast => BROADCAST,
            DenyRule::UniqueLocal => UNIQUE_LOCAL,
            DenyRule::SiteLocal => SITE_LOCAL,
            DenyRule::Ipv4Mapped => IPV4_MAPPED,
            DenyRule::Ipv4Compatible => IPV4_COMPATIBLE,
            DenyRule::Nat64 => NAT64,
            DenyRule::SixToFour => SIX_TO_FOUR,
            DenyRule::Teredo => TEREDO,
            DenyRule::Discard => DISCARD,
        }
    }

    /// Whether addresses under this rule carry an IPv4 address that is the real destination (IPv4-mapped,
    /// IPv4-compatible, NAT64, 6to4). For those, [`AddressPolicy::check_ip`] also checks the embedded IPv4
    /// address, both against the deny list (to report the precise rule) and against the allowlist.
    pub fn embeds_ipv4(&self) -> bool {
        matches!(
            self,
            DenyRule::Ipv4Mapped | DenyRule::Ipv4Compatible | DenyRule::Nat64 | DenyRule::SixToFour
        )
    }

    /// The rule and CIDR with the longest prefix containing `ip`, ignoring any embedded IPv4 address.
    fn lookup(ip: IpAddr) -> Option<(DenyRule, IpNet)> {
        let mut best: Option<(DenyRule, IpNet)> = None;
        for rule in DenyRule::ALL {
            for net in rule.ranges() {
                if net.contains(&ip) && best.is_none_or(|(_, b)| net.prefix_len() > b.prefix_len()) {
                    best = Some((rule, *net));
                }
            }
        }
        best
    }

    /// The CIDR of this rule with the longest prefix containing `ip`, if any.
    fn cidr_for(&self, ip: IpAddr) -> Option<IpNet> {
        self.ranges()
            .iter()
            .filter(|net| net.contains(&ip))
            .max_by_key(|net| net.prefix_len())
            .copied()
    }
}

impl fmt::Display for DenyRule {
    /// `loopback (127.0.0.0/8, ::1/128)`: the description followed by every CIDR of the family.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", self.description())?;
        for (i, net) in self.ranges().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{net}")?;
        }
        f.write_str(")")
    }
}

impl serde::Serialize for DenyRule {
    /// Serialises as the stable [`DenyRule::name`] code, so JSON and logs agree with metrics labels.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// The IPv4 addresses an IPv6 address of an embedding form may stand for.
///
/// Most forms have exactly one. A NAT64 address under the local-use prefix `64:ff9b:1::/48` is ambiguous: the
/// operator's NAT64 prefix may be /48, /56, /64 or /96 long, and RFC 6052 places the IPv4 bits differently for
/// each, so all four readings are returned, the /96 one first (the error names the first reading's rule when all
/// of them are denied; the allowlist must cover all of them).
fn embedded_ipv4s(rule: DenyRule, ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let o = ip.octets();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match rule {
        DenyRule::Ipv4Mapped | DenyRule::Ipv4Compatible => vec![last32],
        DenyRule::Nat64 if o[4] == 0 && o[5] == 0 => vec![last32], // 64:ff9b::/96
        DenyRule::Nat64 => vec![
            last32,                                   // /96 prefix
            Ipv4Addr::new(o[6], o[7], o[9], o[10]),   // /48 prefix (octet 8 is the reserved "u" octet)
            Ipv4Addr::new(o[7], o[9], o[10], o[11]),  // /56 prefix
            Ipv4Addr::new(o[9], o[10], o[11], o[12]), // /64 prefix
        ],
        DenyRule::SixToFour => vec![Ipv4Addr::new(o[2], o[3], o[4], o[5])],
        _ => Vec::new(),
    }
}

/// An address was refused by [`AddressPolicy::check_ip`]: which address, and under which rule.
///
/// `Display` is written for humans and names the matching CIDR, e.g. `127.0.0.1 is loopback (127.0.0.0/8)` or
/// `::ffff:10.0.0.1 embeds 10.0.0.1, which is private-use (10.0.0.0/8)`, because an operator reading a blocked
/// attempt needs to know exactly which range to allowlist, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{}", self.render())]
pub struct AddressDenied {
    /// The address that was checked, as given (not unmapped).
    pub ip: IpAddr,
    /// The family of the range that matched; for an embedding form whose embedded IPv4 address is itself
    /// denied (under every reading, for local-use NAT64), the rule of that IPv4 address.
    pub rule: DenyRule,
}

impl AddressDenied {
    /// The CIDR of [`AddressDenied::rule`] that matched, and the address it matched (the embedded IPv4 address
    /// when the rule was found through an embedding form).
    fn matched(&self) -> Option<(IpAddr, IpNet)> {
        if let Some(net) = self.rule.cidr_for(self.ip) {
            return Some((self.ip, net));
        }
        let IpAddr::V6(v6) = self.ip else { return None };
        let (form, _) = DenyRule::lookup(self.ip)?;
        let v4 = IpAddr::V4(*embedded_ipv4s(form, v6).first()?);
        self.rule.cidr_for(v4).map(|net| (v4, net))
    }

    /// The specific CIDR that denied the address (e.g. `10.0.0.0/8` rather than the whole private-use family),
    /// for structured logs and API error details.
    pub fn cidr(&self) -> Option<IpNet> {
        self.matched().map(|(_, net)| net)
    }

    fn render(&self) -> String {
        let desc = self.rule.description();
        match self.matched() {
            Some((addr, net)) if addr == self.ip => format!("{} is {desc} ({net})", self.ip),
            Some((addr, net)) => format!("{} embeds {addr}, which is {desc} ({net})", self.ip),
            None => format!("{} is denied as {}", self.ip, self.rule),
        }
    }
}

/// Why [`AddressPolicy::check_url`] refused an endpoint URL. `Display` is phrased for an API client and is meant
/// to be used directly as the `detail` of a 422 response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRejected {
    /// The string is not a URL under WHATWG parsing; carries the parser's reason (not the input, which may be
    /// long or contain credentials).
    #[error("endpoint URL is not a valid URL: {0}")]
    Unparseable(String),
    /// The scheme is neither https nor (where the operator enabled it) http; carries the scheme. Other schemes
    /// (file, gopher, ftp, …) are classic SSRF vectors and are never used for delivery.
    #[error("endpoint URL scheme `{0}` is not allowed; use https (http only where the operator enables it)")]
    SchemeNotAllowed(String),
    /// The URL has no host to deliver to.
    #[error("endpoint URL has no host")]
    MissingHost,
    /// The domain name cannot be a DNS name (empty label, label over 63 or name over 253 characters); rejected
    /// up front so the registrant gets a 422 instead of an endpoint that can only ever fail to resolve.
    #[error("endpoint URL host `{0}` is not a valid domain name")]
    InvalidDomain(String),
    /// The host is an IP literal that the address policy denies.
    #[error("endpoint URL host is not allowed: {0}")]
    Denied(#[from] AddressDenied),
    /// The host is `localhost` or a `*.localhost` name (RFC 6761 reserves them for the local host), and the
    /// operator has not allowlisted 127.0.0.1.
    #[error("endpoint URL host is a localhost name, which refers to this machine")]
    LocalhostName,
    /// The port is outside the operator's port allowlist, or is 0 (which no server listens on). A port
    /// allowlist keeps endpoints off the well-known ports of internal services (SSH, SMTP, Redis, …) that a
    /// reachable public address might also expose.
    #[error("endpoint URL port {port} is not allowed{}", allowed_ports_hint(allowed))]
    PortNotAllowed {
        /// The port the URL names (or its scheme's default).
        port: u16,
        /// The operator's allowlist; empty when the port was refused for being 0.
        allowed: Vec<u16>,
    },
}

/// The tail of [`UrlRejected::PortNotAllowed`]'s message: which ports the operator does allow.
fn allowed_ports_hint(allowed: &[u16]) -> String {
    if allowed.is_empty() {
        return String::new();
    }
    let list: Vec<String> = allowed.iter().map(u16::to_string).collect();
    format!("; the port allowlist is {}", list.join(", "))
}

impl UrlRejected {
    /// A stable snake_case code for logs, metrics and machine-readable API errors.
    pub fn code(&self) -> &'static str {
        match self {
            UrlRejected::Unparseable(_) => "unparseable",
            UrlRejected::SchemeNotAllowed(_) => "scheme_not_allowed",
            UrlRejected::MissingHost => "missing_host",
            UrlRejected::InvalidDomain(_) => "invalid_domain",
            UrlRejected::Denied(_) => "address_denied",
            UrlRejected::LocalhostName => "localhost_name",
            UrlRejected::PortNotAllowed { .. } => "port_not_allowed",
        }
    }
}

/// The host of a vetted endpoint URL, in the form the HTTP client and the resolver need.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// An IP literal that already passed [`AddressPolicy::check_ip`]. The client connects to it directly (no
    /// resolver is involved for literals, which is why it is checked here).
    Ip(IpAddr),
    /// A domain name, lower-cased and without its trailing dot, to be resolved by the SSRF-checked resolver;
    /// every address it resolves to must pass [`AddressPolicy::check_ip`].
    Domain(String),
}

impl fmt::Display for TargetHost {
    /// The host as it would be written in a URL authority: IPv6 literals in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            TargetHost::Ip(ip) => write!(f, "{ip}"),
            TargetHost::Domain(name) => f.write_str(name),
        }
    }
}

/// An endpoint URL that passed [`AddressPolicy::check_url`], with the host and port the client will connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The parsed (WHATWG-normalised) URL to send the request to; its serialisation is the canonical form to
    /// store.
    pub url: Url,
    /// The host to connect to: a vetted IP literal, or a domain still to be resolved and vetted.
    pub host: TargetHost,
    /// The port to connect to (the scheme's default when the URL has none).
    pub port: u16,
}

/// The operator's SSRF policy: the fixed deny list, minus the CIDRs the operator explicitly allows, plus
/// whether plain http is acceptable and which ports endpoints may use.
///
/// The allowlist exists for local development and for deployments that must deliver to internal services; it is
/// explicit because every entry reopens a hole the deny list closes. http is off by default in production
/// because payloads and signatures would travel in clear text. The port allowlist is empty (any port) by
/// default, because receivers legitimately listen on odd ports; operators who know better can narrow it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow_cidrs: Vec<IpNet>,
    allow_http: bool,
    allow_ports: Vec<u16>,
}

impl AddressPolicy {
    /// A policy that lets addresses inside `allow_cidrs` through despite the deny list, and accepts `http` URLs
    /// when `allow_http` is true (https is always accepted).
    pub fn new(allow_cidrs: Vec<IpNet>, allow_http: bool) -> Self {
        Self {
            allow_cidrs: allow_cidrs.into_iter().map(|net| net.trunc()).collect(),
            allow_http,
            allow_ports: Vec::new(),
        }
    }

    /// The operator's allowlisted CIDRs (normalised to their network address), e.g. for the startup log.
    pub fn allow_cidrs(&self) -> &[IpNet] {
        &self.allow_cidrs
    }

    /// Whether plain `http` endpoint URLs are accepted.
    pub fn allows_http(&self) -> bool {
        self.allow_http
    }

    /// The same policy, accepting only URLs whose port (explicit, or the scheme's default) is in `ports`; an
    /// empty list accepts any port. Sorted and deduplicated so error messages are stable.
    pub fn with_allowed_ports(mut self, ports: impl IntoIterator<Item = u16>) -> Self {
        let mut ports: Vec<u16> = ports.into_iter().collect();
        ports.sort_unstable();
        ports.dedup();
        self.allow_ports = ports;
        self
    }

    /// The port allowlist; empty means any port (except 0).
    pub fn allowed_ports(&self) -> &[u16] {
        &self.allow_ports
    }

    /// Checks the port an endpoint URL connects to against the port allowlist. Port 0 is always refused: no
    /// server listens on it, and some stacks treat it as "any port".
    pub fn check_port(&self, port: u16) -> Result<(), UrlRejected> {
        if port == 0 || !(self.allow_ports.is_empty() || self.allow_ports.contains(&port)) {
            return Err(UrlRejected::PortNotAllowed {
                port,
                allowed: self.allow_ports.clone(),
            });
        }
        Ok(())
    }

    fn allowlisted(&self, ip: IpAddr) -> bool {
        self.allow_cidrs.iter().any(|net| net.contains(&ip))
    }

    /// Checks one resolved or literal address against the deny list.
    ///
    /// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`, `64:ff9b:1::/48`)
    /// and 6to4 (`2002::/16`) addresses are denied as such, and their embedded IPv4 address is checked as well so
    /// the error names the real target. An address inside an allowlisted CIDR passes; for the embedding forms it
    /// also passes when the embedded IPv4 address is allowlisted (allowlisting `127.0.0.0/8` admits
    /// `::ffff:127.0.0.1`), since that is where the connection actually goes.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), AddressDenied> {
        if self.allowlisted(ip) {
            return Ok(());
        }
        let Some((rule, _)) = DenyRule::lookup(ip) else {
            return Ok(());
        };
        let IpAddr::V6(v6) = ip else {
            return Err(AddressDenied { ip, rule });
        };
        let embedded = embedded_ipv4s(rule, v6);
        if !embedded.is_empty() && embedded.iter().all(|v4| self.allowlisted(IpAddr::V4(*v4))) {
            return Ok(());
        }
        // Name the real target's rule when every reading of the embedded address is denied; an ambiguous
        // local-use NAT64 address with a public reading is reported as NAT64 (still denied, as a whole).
        let embedded_rules: Option<Vec<DenyRule>> = embedded
            .iter()
            .map(|v4| DenyRule::lookup(IpAddr::V4(*v4)).map(|(r, _)| r))
            .collect();
        let rule = match embedded_rules.as_deref() {
            Some([first, ..]) => *first,
            _ => rule,
        };
        Err(AddressDenied { ip, rule })
    }

    /// Parses and vets an endpoint URL exactly as the HTTP client will use it.
    ///
    /// Parsing is WHATWG's (the `url` crate, as reqwest uses), which normalises the obfuscated spellings of IPv4
    /// hosts (`127.1`, `2130706433`, `0x7f000001`, octal `0177.0.0.1`, percent-encoded or full-width digits) into
    /// a plain IP literal before the check, and rejects IPv6 zone ids. Rejects: unparseable input; schemes other
    /// than https (and http when allowed); a missing or malformed host; IP-literal hosts that fail
    /// [`AddressPolicy::check_ip`]; `localhost` / `*.localhost` in any case, with or without a trailing dot,
    /// unless 127.0.0.1 is allowlisted; and ports outside the port allowlist ([`AddressPolicy::check_port`]).
    /// Userinfo is permitted and ignored: only the host decides (`http://a@127.0.0.1/` goes to 127.0.0.1).
    ///
    /// Passing this check is not enough for a domain host: the resolver must vet every address it resolves to.
    pub fn check_url(&self, url: &str) -> Result<Target, UrlRejected> {
        let parsed = Url::parse(url).map_err(|e| UrlRejected::Unparseable(e.to_string()))?;
        let default_port = match parsed.scheme() {
            "https" => 443,
            "http" if self.allow_http => 80,
            other => return Err(UrlRejected::SchemeNotAllowed(other.to_owned())),
        };
        let host = match parsed.host() {
            None => return Err(UrlRejected::MissingHost),
            Some(Host::Ipv4(ip)) => {
                self.check_ip(IpAddr::V4(ip))?;
                TargetHost::Ip(IpAddr::V4(ip))
            }
            Some(Host::Ipv6(ip)) => {
                self.check_ip(IpAddr::V6(ip))?;
                TargetHost::Ip(IpAddr::V6(ip))
            }
            Some(Host::Domain(raw)) => {
                let lower = raw.to_ascii_lowercase();
                let name = lower.strip_suffix('.').unwrap_or(&lower);
                if !is_dns_name(name) {
                    return Err(UrlRejected::InvalidDomain(raw.to_owned()));
                }
                if is_localhost_name(name) && !self.allowlisted(LOCALHOST_V4) {
                    return Err(UrlRejected::LocalhostName);
                }
                TargetHost::Domain(name.to_owned())
            }
        };
        // The port the connection will use: WHATWG drops an explicit default port, so fall back to the scheme's.
        let port = parsed.port_or_known_default().unwrap_or(default_port);
        self.check_port(port)?;
        Ok(Target {
            url: parsed,
            host,
            port,
        })
    }
}

/// Whether `name` (already without its trailing dot) has the shape of a DNS name: 1–253 characters, no empty
/// label, no label over 63 characters.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(|label| !label.is_empty() && label.len() <= 63)
}

/// `localhost` and every name under it refer to the local host (RFC 6761 §6.3; resolvers answer them locally).
fn is_localhost_name(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(ip: &str) -> AddressDenied {
        AddressPolicy::default().check_ip(ip.parse().unwrap()).expect_err(ip)
    }

    #[test]
    fn every_range_is_a_network_address_and_belongs_to_one_rule() {
        let mut seen = Vec::new();
        for rule in DenyRule::ALL {
            assert!(!rule.ranges().is_empty(), "{rule:?}");
            for net in rule.ranges() {
                assert_eq!(*net, net.trunc(), "{net} of {rule:?} is not a network address");
                assert!(!seen.contains(net), "{net} listed twice");
                seen.push(*net);
            }
        }
    }

    #[test]
    fn names_are_unique_snake_case() {
        let names: Vec<_> = DenyRule::ALL.iter().map(DenyRule::name).collect();
        for (i, n) in names.iter().enumerate() {
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{n}"
            );
            assert!(!names[..i].contains(n), "{n} duplicated");
        }
    }

    #[test]
    fn longest_prefix_wins() {
        assert_eq!(deny("255.255.255.255").rule, DenyRule::Broadcast);
        assert_eq!(deny("255.255.255.254").rule, DenyRule::Reserved);
        assert_eq!(deny("0.0.0.0").rule, DenyRule::Unspecified);
        assert_eq!(deny("0.1.2.3").rule, DenyRule::ThisNetwork);
        assert_eq!(deny("::").rule, DenyRule::Unspecified);
        assert_eq!(deny("::1").rule, DenyRule::Loopback);
        assert_eq!(deny("2001::1").rule, DenyRule::Teredo);
        assert_eq!(deny("2001:2::1").rule, DenyRule::Benchmarking);
        assert_eq!(deny("2001:1::1").rule, DenyRule::IetfProtocol);
        assert_eq!(deny("2001:db8::1").rule, DenyRule::Documentation);
        assert_eq!(deny("1::1").rule, DenyRule::Reserved);
    }

    #[test]
    fn embedded_rule_and_cidr_are_reported() {
        let d = deny("::ffff:10.0.0.1");
        assert_eq!(d.rule, DenyRule::Private);
        assert_eq!(d.cidr(), Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(
            d.to_string(),
            "::ffff:10.0.0.1 embeds 10.0.0.1, which is private-use (10.0.0.0/8)"
        );
        let d = deny("::ffff:93.184.215.14");
        assert_eq!(d.rule, DenyRule::Ipv4Mapped);
        assert_eq!(
            d.to_string(),
            "::ffff:93.184.215.14 is IPv4-mapped IPv6 (::ffff:0.0.0.0/96)"
        );
    }

    #[test]
    fn local_use_nat64_reads_every_rfc6052_layout() {
        let ten = Ipv4Addr::new(10, 0, 0, 5);
        let layouts = [
            "64:ff9b:1::a00:5",      // /96
            "64:ff9b:1:0:a:0:500::", // /64: octets 9..12
            "64:ff9b:1:a:0:5::",     // /56: octet 7, then 9..11
            "64:ff9b:1:a00:0:500::", // /48: octets 6..7, then 9..10
        ];
        for s in layouts {
            let ip: Ipv6Addr = s.parse().unwrap();
            assert!(embedded_ipv4s(DenyRule::Nat64, ip).contains(&ten), "{s}");
            assert!(AddressPolicy::default().check_ip(ip.into()).is_err(), "{s}");
        }
        assert_eq!(deny("64:ff9b:1::a00:5").rule, DenyRule::Private);
        // The allowlist must cover every reading, or the gateway could use another one.
        let policy = AddressPolicy::new(vec!["10.0.0.0/8".parse().unwrap()], false);
        assert!(policy.check_ip("64:ff9b:1:a00:0:500::".parse().unwrap()).is_err());
        assert!(policy.check_ip("64:ff9b::a00:5".parse().unwrap()).is_ok());
    }

    #[test]
    fn allowlist_is_truncated_to_network() {
        let policy = AddressPolicy::new(vec!["127.0.0.1/8".parse().unwrap()], true);
        assert_eq!(policy.allow_cidrs(), &["127.0.0.0/8".parse::<IpNet>().unwrap()]);
    }
}
