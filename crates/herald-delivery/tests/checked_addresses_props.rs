//! Properties of `checked_addresses`, the vetting step every connection goes through: whatever a resolver
//! answers, a connection may only be offered addresses the policy allows, and an answer containing any denied
//! address yields none at all. No sockets: this only resolves (with a scripted resolver) and checks.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::ScriptedResolver;
use herald_core::address::AddressPolicy;
use herald_delivery::{ConnectError, checked_addresses};
use proptest::prelude::*;

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        // Mapped forms, which a resolver may return and which must be judged by their IPv4 part.
        any::<u32>().prop_map(|a| IpAddr::V6(Ipv4Addr::from(a).to_ipv6_mapped())),
        // Plenty of addresses from the ranges that matter most.
        (0u32..=0x00ff_ffff).prop_map(|a| IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | a))),
        (0u32..=0x00ff_ffff).prop_map(|a| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | a))),
        (0u32..=0xffff).prop_map(|a| IpAddr::V4(Ipv4Addr::from(0xa9fe_0000 | a))),
    ]
}

fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn policies() -> impl Strategy<Value = AddressPolicy> {
    prop_oneof![
        Just(AddressPolicy::new(vec![], false)),
        Just(AddressPolicy::new(vec!["127.0.0.0/8".parse().expect("cidr")], true)),
        Just(AddressPolicy::new(
            vec!["10.0.0.0/8".parse().expect("cidr"), "::1/128".parse().expect("cidr")],
            true
        )),
    ]
}

proptest! {
    #[test]
    fn only_allowed_addresses_are_ever_offered(
        policy in policies(),
        answer in proptest::collection::vec(any_ip(), 0..6),
        port in 1u16..,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let resolver = ScriptedResolver::answering(answer.clone());
        let result = runtime.block_on(checked_addresses(&policy, resolver.as_ref(), "name.test", port));
        let any_denied = answer.iter().any(|ip| policy.check_ip(unmap(*ip)).is_err());
        match result {
            Ok(addrs) => {
                prop_assert!(!any_denied, "{answer:?} had a denied address but {addrs:?} was offered");
                prop_assert_eq!(addrs.len(), answer.len());
                for (addr, ip) in addrs.iter().zip(&answer) {
                    prop_assert_eq!(addr.ip(), unmap(*ip));
                    prop_assert_eq!(addr.port(), port);
                    prop_assert!(policy.check_ip(addr.ip()).is_ok());
                }
            }
            Err(ConnectError::Blocked(reason)) => {
                prop_assert!(any_denied, "{answer:?} was blocked: {reason}");
                prop_assert!(reason.starts_with("name.test resolved to a denied address: "), "{reason}");
            }
            Err(ConnectError::Resolve { .. }) => prop_assert!(answer.is_empty()),
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }

    #[test]
    fn a_literal_is_offered_exactly_when_the_policy_allows_it(policy in policies(), ip in any_ip(), port in 1u16..) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let resolver = ScriptedResolver::answering(vec![]);
        let host = match ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        };
        let result = runtime.block_on(checked_addresses(&policy, resolver.as_ref(), &host, port));
        match policy.check_ip(ip) {
            Ok(()) => prop_assert_eq!(result.expect("allowed").first().map(|a| a.ip()), Some(ip)),
            Err(denied) => prop_assert!(
                matches!(&result, Err(ConnectError::Blocked(reason)) if *reason == denied.to_string()),
                "{result:?}"
            ),
        }
        prop_assert_eq!(resolver.lookups(), 0);
    }
}
