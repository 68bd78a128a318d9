//! Spot or on-demand: how a pool's GPUs should be bought, by expected cost including
//! the work lost to interruptions, with a per-pool on-demand floor.
//!
//! A spot GPU-hour costs its price, plus the work an interruption throws away: at
//! `interruptions_per_hour` and `loss_hours` lost per interruption (half the
//! checkpoint interval, see `PodRequest::expected_loss_hours`), one useful hour needs
//! `1 + rate · loss` paid hours. Spot is used only when that expected price is below
//! on-demand, and never for the pool's on-demand floor (capacity that must survive a
//! spot reclaim wave: serving replicas, gang leaders).

/// Prices per GPU-hour of a pool's two capacity types, and the spot risk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolPrices {
    pub on_demand_per_gpu_hour: f64,
    pub spot_per_gpu_hour: f64,
    pub spot_interruptions_per_hour: f64,
}

/// How many GPUs of each type to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityMix {
    pub on_demand: u32,
    pub spot: u32,
}

/// Expected price of one useful spot GPU-hour.
pub fn spot_effective_price(prices: &PoolPrices, loss_hours: f64) -> f64 {
    let rate = prices.spot_interruptions_per_hour.max(0.0);
    prices.spot_per_gpu_hour * (1.0 + rate * loss_hours.max(0.0))
}

/// The mix for `gpus` GPUs with at least `on_demand_floor` (0..=1) of them on-demand.
pub fn capacity_mix(
    gpus: u32,
    on_demand_floor: f64,
    prices: &PoolPrices,
    loss_hours: f64,
) -> CapacityMix {
    let floor = (f64::from(gpus) * on_demand_floor.clamp(0.0, 1.0)).ceil() as u32;
    let floor = floor.min(gpus);
    if spot_effective_price(prices, loss_hours) < prices.on_demand_per_gpu_hour {
        CapacityMix {
            on_demand: floor,
            spot: gpus - floor,
        }
    } else {
        CapacityMix {
            on_demand: gpus,
            spot: 0,
        }
    }
}

/// Expected cost per hour of a mix.
pub fn expected_cost_per_hour(mix: CapacityMix, prices: &PoolPrices, loss_hours: f64) -> f64 {
    f64::from(mix.on_demand) * prices.on_demand_per_gpu_hour
        + f64::from(mix.spot) * spot_effective_price(prices, loss_hours)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICES: PoolPrices = PoolPrices {
        on_demand_per_gpu_hour: 4.0,
        spot_per_gpu_hour: 1.5,
        spot_interruptions_per_hour: 0.05,
    };

    #[test]
    fn spot_beyond_the_floor_when_it_pays() {
        let mix = capacity_mix(10, 0.25, &PRICES, 0.5);
        assert_eq!(
            mix,
            CapacityMix {
                on_demand: 3,
                spot: 7
            }
        );
        // Never cheaper to move any GPU to the other type.
        let cost = expected_cost_per_hour(mix, &PRICES, 0.5);
        let all_on_demand = expected_cost_per_hour(
            CapacityMix {
                on_demand: 10,
                spot: 0,
            },
            &PRICES,
            0.5,
        );
        assert!(cost < all_on_demand);
    }

    #[test]
    fn on_demand_when_interruptions_eat_the_discount() {
        // 1.5 * (1 + 0.05 * 40) = 4.5 > 4.0
        let mix = capacity_mix(10, 0.0, &PRICES, 40.0);
        assert_eq!(
            mix,
            CapacityMix {
                on_demand: 10,
                spot: 0
            }
        );
    }

    #[test]
    fn floor_is_clamped_and_rounded_up() {
        assert_eq!(
            capacity_mix(3, 0.5, &PRICES, 0.5),
            CapacityMix {
                on_demand: 2,
                spot: 1
            }
        );
        assert_eq!(
            capacity_mix(3, 7.0, &PRICES, 0.5),
            CapacityMix {
                on_demand: 3,
                spot: 0
            }
        );
        assert_eq!(
            capacity_mix(0, 0.5, &PRICES, 0.5),
            CapacityMix {
                on_demand: 0,
                spot: 0
            }
        );
    }
}
