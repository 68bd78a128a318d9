//! Dominant resource fairness (Ghodsi et al., "Dominant Resource Fairness: Fair
//! Allocation of Multiple Resource Types", NSDI'11), and Jain's fairness index.
//!
//! Progressive filling: repeatedly give one more task to the tenant with the lowest
//! weighted dominant share whose next task still fits (ties by tenant order), until no
//! tenant's next task fits or every tenant reached its quota.

#[derive(Debug, Clone, PartialEq)]
pub struct TenantDemand {
    /// Resources one task needs, in the same order as the capacity vector.
    pub per_task: Vec<f64>,
    /// Most tasks this tenant wants (its queue), or its quota.
    pub max_tasks: u32,
    /// Relative weight; a tenant with weight 2 is entitled to twice the dominant share.
    pub weight: f64,
}

/// A tenant's dominant share: the largest fraction of any resource it holds.
pub fn dominant_share(capacity: &[f64], used: &[f64]) -> f64 {
    capacity
        .iter()
        .zip(used)
        .filter(|(cap, _)| **cap > 0.0)
        .map(|(cap, used)| used / cap)
        .fold(0.0, f64::max)
}

/// Tasks per tenant under DRF.
pub fn drf_allocate(capacity: &[f64], tenants: &[TenantDemand]) -> Vec<u32> {
    let mut tasks = vec![0u32; tenants.len()];
    let mut used = vec![vec![0.0; capacity.len()]; tenants.len()];
    let mut free = capacity.to_vec();
    loop {
        let fits = |idx: usize| {
            tasks[idx] < tenants[idx].max_tasks
                && tenants[idx]
                    .per_task
                    .iter()
                    .zip(&free)
                    .all(|(need, left)| *need <= *left + 1e-9)
                && tenants[idx].per_task.iter().any(|need| *need > 0.0)
        };
        let next = (0..tenants.len()).filter(|idx| fits(*idx)).min_by(|a, b| {
            let share =
                |idx: usize| dominant_share(capacity, &used[idx]) / tenants[idx].weight.max(1e-9);
            share(*a).total_cmp(&share(*b)).then(a.cmp(b))
        });
        let Some(idx) = next else {
            return tasks;
        };
        tasks[idx] += 1;
        for (resource, need) in tenants[idx].per_task.iter().enumerate() {
            used[idx][resource] += need;
            free[resource] -= need;
        }
    }
}

/// Jain's fairness index of non-negative values: 1 when all equal, 1/n at worst.
pub fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if values.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(per_task: &[f64]) -> TenantDemand {
        TenantDemand {
            per_task: per_task.to_vec(),
            max_tasks: u32::MAX,
            weight: 1.0,
        }
    }

    /// The paper's example: 9 CPUs and 18 GB; A's tasks need <1 CPU, 4 GB>, B's
    /// <3 CPU, 1 GB>. DRF gives A three tasks and B two, equalising dominant shares at 2/3.
    #[test]
    fn golden_two_user_example_from_the_drf_paper() {
        let capacity = [9.0, 18.0];
        let allocation = drf_allocate(&capacity, &[tenant(&[1.0, 4.0]), tenant(&[3.0, 1.0])]);
        assert_eq!(allocation, vec![3, 2]);
        assert!((dominant_share(&capacity, &[3.0, 12.0]) - 2.0 / 3.0).abs() < 1e-12);
        assert!((dominant_share(&capacity, &[6.0, 2.0]) - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn quotas_and_weights_are_respected() {
        let capacity = [10.0];
        let mut capped = tenant(&[1.0]);
        capped.max_tasks = 2;
        assert_eq!(
            drf_allocate(&capacity, &[capped, tenant(&[1.0])]),
            vec![2, 8]
        );
        let mut heavy = tenant(&[1.0]);
        heavy.weight = 3.0;
        assert_eq!(
            drf_allocate(&capacity, &[heavy, tenant(&[1.0])]),
            vec![7, 3]
        );
    }

    #[test]
    fn jain_index_bounds() {
        assert!((jain_index(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }
}
