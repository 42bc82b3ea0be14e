//! IPv6 twins of the allocation tests in lib.rs (issue 28): round robin, exhaustion and a
//! freed address found again; a requested address taken, out of bounds or the gateway; a
//! dual-stack request listed IPv6 first.

use super::tests::{alloc, config, ip, set, store};
use super::*;

#[test]
fn ipv6_round_robin_takes_the_last_address_and_exhausts() {
    let d = tempfile::tempdir().unwrap();
    let mut s = store(&d);
    let set = set(&[("2001:db8::/125", None, None)]); // ::2 … ::7: IPv6 has no broadcast
    let got: Vec<String> =
        ["a", "b", "c", "d", "e", "f"].iter().map(|id| alloc(&mut s, &set, id, None).unwrap()).collect();
    assert_eq!(
        got,
        [
            "2001:db8::2/125",
            "2001:db8::3/125",
            "2001:db8::4/125",
            "2001:db8::5/125",
            "2001:db8::6/125",
            "2001:db8::7/125"
        ]
    );
    let e = alloc(&mut s, &set, "g", None).unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str()),
        (999, "no IP addresses available in range set: 2001:db8::1-2001:db8::7")
    );
    let (slot, _) = s.held_exact(&AttachmentId::new("net", "b", "eth0")).unwrap()[0];
    s.release(slot, ip("2001:db8::3")).unwrap();
    assert_eq!(alloc(&mut s, &set, "g", None).unwrap(), "2001:db8::3/125");
}

#[test]
fn an_ipv6_request_taken_out_of_bounds_or_the_gateway_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut s = store(&d);
    let bounded = set(&[("2001:db8::/64", Some("2001:db8::10"), Some("2001:db8::20"))]);
    assert_eq!(alloc(&mut s, &bounded, "a", Some("2001:db8::15")).unwrap(), "2001:db8::15/64");
    let e = alloc(&mut s, &bounded, "b", Some("2001:db8::15")).unwrap_err();
    assert_eq!(
        e.msg,
        "requested IP address 2001:db8::15 is not available in range set 2001:db8::10-2001:db8::20"
    );
    assert_eq!(alloc(&mut s, &bounded, "c", None).unwrap(), "2001:db8::16/64");
    for bad in ["2001:db8::21", "2001:db8::f", "2001:db8:1::15"] {
        let e = plan_requests(&config(vec![bounded.clone()], &[bad])).unwrap_err();
        assert_eq!((e.code, e.msg.clone()), (7, format!("failed to allocate all requested IPs: {bad}")));
    }
    let e =
        plan_requests(&config(vec![set(&[("2001:db8::/64", None, None)])], &["2001:db8::1"])).unwrap_err();
    assert_eq!(e.msg, "requested ip 2001:db8::1 is subnet's gateway");
}

#[test]
fn a_dual_stack_request_listed_ipv6_first_binds_each_to_its_set() {
    let sets = vec![set(&[("10.0.0.0/24", None, None)]), set(&[("2001:db8::/64", None, None)])];
    for req in [["10.0.0.5", "2001:db8::5"], ["2001:db8::5", "10.0.0.5"]] {
        let plan = plan_requests(&config(sets.clone(), &req)).unwrap();
        assert_eq!(plan, vec![Some(ip("10.0.0.5")), Some(ip("2001:db8::5"))], "{req:?}");
    }
}
