//! A bounded map of plans: at most `capacity` entries, the least recently used dropped
//! first. Pure (no clock: recency is a counter), so the bound is a property test.

/// Plans by key, at most `capacity` of them.
#[derive(Debug)]
pub struct PlanCache<K, V> {
    capacity: usize,
    /// (key, value, last use); a handful of entries, so a scan beats a map.
    entries: Vec<(K, V, u64)>,
    uses: u64,
    /// Entries dropped to stay within the bound.
    pub evicted: u64,
}

impl<K: PartialEq, V: Clone> PlanCache<K, V> {
    /// A cache of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        PlanCache {
            capacity: capacity.max(1),
            entries: Vec::new(),
            uses: 0,
            evicted: 0,
        }
    }

    /// The value for `key`, marked as just used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        self.uses += 1;
        let now = self.uses;
        self.entries
            .iter_mut()
            .find(|(k, _, _)| k == key)
            .map(|entry| {
                entry.2 = now;
                entry.1.clone()
            })
    }

    /// Keeps `value` for `key` (replacing one there), dropping the least recently used
    /// entry when full.
    pub fn insert(&mut self, key: K, value: V) {
        self.uses += 1;
        let now = self.uses;
        if let Some(entry) = self.entries.iter_mut().find(|(k, _, _)| *k == key) {
            entry.1 = value;
            entry.2 = now;
            return;
        }
        if self.entries.len() >= self.capacity {
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(i, _)| i)
            {
                self.entries.swap_remove(oldest);
                self.evicted += 1;
            }
        }
        self.entries.push((key, value, now));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut cache = PlanCache::new(2);
        cache.insert(1, "a");
        cache.insert(2, "b");
        assert_eq!(cache.get(&1), Some("a"));
        cache.insert(3, "c");
        assert_eq!(cache.get(&2), None, "2 was used least recently");
        assert_eq!(cache.get(&1), Some("a"));
        assert_eq!(cache.get(&3), Some("c"));
        assert_eq!(cache.evicted, 1);
    }

    proptest! {
        #[test]
        fn never_over_capacity_and_the_last_insert_is_kept(
            capacity in 1usize..6,
            ops in proptest::collection::vec((any::<bool>(), 0u8..10), 0..200),
        ) {
            let mut cache = PlanCache::new(capacity);
            for (insert, key) in ops {
                if insert {
                    cache.insert(key, u32::from(key) * 10);
                    prop_assert_eq!(cache.get(&key), Some(u32::from(key) * 10));
                } else if let Some(v) = cache.get(&key) {
                    prop_assert_eq!(v, u32::from(key) * 10);
                }
                prop_assert!(cache.len() <= capacity);
            }
        }
    }
}
