//! Fencing on etcd, step by step, with the control plane's own etcd client against a
//! real etcd: a replica that led and was deposed (its lease ended while it was paused
//! or cut off) can neither write nor delete, whatever it still believes; the new
//! leader can. This is what keeps two replicas from ever both acting on the fleet.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use nephele_cloud::store::etcd::{Campaign, Etcd, Op};
use nephele_cloud::store::StoreError;
use nephele_e2e::etcd::EtcdCluster;

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    }
}

#[test]
fn a_deposed_leader_can_neither_write_nor_delete() {
    let Some(cluster) = EtcdCluster::start("fencing", 1).unwrap() else {
        return;
    };
    let one = Etcd::connect(&cluster.endpoints(), "/fencing/").unwrap();
    let two = Etcd::connect(&cluster.endpoints(), "/fencing/").unwrap();
    let leader = "/fencing/leader";
    let (a, b) = (one.key("deployments", "a"), one.key("deployments", "b"));

    // One leads on a short lease it then stops renewing (as if paused).
    let lease = one.grant_lease(2).unwrap();
    let Campaign::Won { revision } = one.campaign(leader, b"one", lease).unwrap() else {
        panic!("the first campaign must win");
    };
    one.fence_on(leader, revision);
    one.txn(&[put(&a, "by one")]).unwrap();
    let lease_two = two.grant_lease(2).unwrap();
    assert_eq!(
        two.campaign(leader, b"two", lease_two).unwrap(),
        Campaign::Held {
            by: b"one".to_vec()
        }
    );

    // Its lease ends; two takes over.
    let begun = Instant::now();
    let revision_two = loop {
        let lease = two.grant_lease(5).unwrap();
        if let Campaign::Won { revision } = two.campaign(leader, b"two", lease).unwrap() {
            break revision;
        }
        assert!(begun.elapsed() < Duration::from_secs(15), "never took over");
        std::thread::sleep(Duration::from_millis(200));
    };
    two.fence_on(leader, revision_two);

    // One still thinks it leads: every write of its is refused, and nothing is made.
    let refused = one.txn(&[put(&b, "by one, deposed")]).unwrap_err();
    assert!(matches!(refused, StoreError::Fenced(_)), "{refused}");
    assert!(
        refused.to_string().contains("no longer the leader"),
        "{refused}"
    );
    assert_eq!(one.get(&b).unwrap(), None);
    let refused = one.delete(&a).unwrap_err();
    assert!(matches!(refused, StoreError::Fenced(_)), "{refused}");
    assert_eq!(one.get(&a).unwrap(), Some(b"by one".to_vec()));

    // Two writes and deletes.
    two.txn(&[put(&b, "by two")]).unwrap();
    assert_eq!(two.get(&b).unwrap(), Some(b"by two".to_vec()));
    assert!(two.delete(&a).unwrap());
    assert_eq!(two.get(&a).unwrap(), None);
}
