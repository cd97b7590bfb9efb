//! The resource allocator: how much of the device each inference function
//! (IF) gets, and, on a CPU host, which cores that is.
//!
//! The orchestrator reasons in *percent of the device*: the CUDA MPS active
//! thread percentage on a GPU host, a fraction of the NIC-local cores on a
//! CPU host. Each IF states a [`Claim`]: a weight (its priority), its elastic
//! demand (what the self-tuning loop of [`crate::tuning`] says it needs), an
//! optional pin (a share the user fixed by hand) and a floor. The
//! [`ShareAllocator`] turns the claims into one [`Share`] per IF. It is
//! sans-IO and stateless: the same claims always give the same allocation,
//! it reads no clock and applies nothing; the daemon applies the result
//! (through a shadow switchover, since a share is fixed when an IF's process
//! starts).
//!
//! # Algorithm
//!
//! With `C` the capacity (100% of the device unless configured lower):
//!
//! 1. **Pins first.** Every pinned IF gets exactly its pin; the allocator
//!    never changes it. If the pins alone exceed `C` that is an
//!    [`AllocError::PinsExceedCapacity`], not a panic and not a silent
//!    scale-down: the user asked for something impossible and must hear it.
//!    The rest, `R = C − Σ pins`, is shared among the unpinned IFs.
//! 2. **Floors.** Unpinned IF `i` with weight `wᵢ` has the *weighted equal
//!    split* `eᵢ = R · wᵢ / Σw` and the floor `fᵢ = min(min_pctᵢ, eᵢ)`. Since
//!    `fᵢ ≤ eᵢ`, the floors always fit in `R` together: there is no error
//!    path for them, and a floor never takes from another IF more than the
//!    equal split would. A floor exists because an IF process with a
//!    vanishing share is useless (an MPS context at 1% gets one or two SMs;
//!    the CPU form needs at least one core) and because an IF whose demand
//!    fell to nothing must still be able to show, by its telemetry, that it
//!    needs more. The floor beats the demand: IF `i`'s *effective demand* is
//!    `dᵢ = max(demand_pctᵢ, fᵢ)`.
//! 3. **Weighted max-min fairness with demand caps (water-filling).** If
//!    `Σ dᵢ ≥ R` the IFs compete, and each gets `sᵢ = clamp(λ·wᵢ, fᵢ, dᵢ)`
//!    for the one *water level* `λ` with `Σ sᵢ = R`. Every IF not held at its
//!    floor or its demand sits at the same normalized share `sᵢ/wᵢ = λ`; an
//!    IF capped by its demand has `sᵢ/wᵢ ≤ λ`. This is the weighted max-min
//!    fair allocation: no IF below its demand can get more without taking
//!    from an IF whose normalized share is smaller or equal, or from an IF
//!    that is at its floor (or pinned). `λ` is found exactly: `Σ sᵢ(λ)` is
//!    continuous, non-decreasing and piecewise linear in `λ` with its kinks
//!    at `fᵢ/wᵢ` and `dᵢ/wᵢ`, so the segment holding `R` is found by walking
//!    the sorted kinks and `λ` by linear interpolation on it.
//! 4. **Leftovers (work conservation).** If `Σ dᵢ < R` everyone gets its
//!    effective demand and `R − Σ dᵢ` is left over. With
//!    [`AllocConfig::work_conserving`] (the default) the leftover is
//!    water-filled again without the demand caps: `sᵢ = max(dᵢ, μ·wᵢ)` with
//!    `Σ sᵢ = R`, so it goes first to the IFs with the smallest normalized
//!    share, up to the weighted equal split; an IF already above that keeps
//!    its demand and gets nothing more. Without it, the leftover stays idle
//!    ([`Allocation::idle_pct`]) and no IF is ever above its effective
//!    demand.
//!
//! A share above the demand is free headroom: below an IF's knee it lowers
//! its latency, above it it changes nothing, and the device would idle
//! otherwise. That is why work conservation is on by default. It has two
//! costs, which is why it can be turned off: a share is applied by starting
//! a new process (shadow switchover), so leftovers handed out now must be
//! taken back, with more switchovers, when a new IF arrives or a demand
//! grows; and the shadow standby of a switchover needs room of its own on a
//! CPU host. A deployment that prefers stable shares and reserved headroom
//! turns it off (or lowers [`AllocConfig::capacity_pct`]). Leftovers are
//! water-filled rather than split in proportion to the weights so that they
//! go where they raise the smallest normalized share; a proportional split
//! would give most of the spare capacity to the heavy IFs that already have
//! the most. The self-tuning loop does not mistake a leftover for a need:
//! it tunes the *demand*, and an IF that is over-provisioned only through
//! leftovers keeps its demand (see [`crate::tuning`]).
//!
//! Raising one IF's demand never lowers its own share and never raises
//! another's (the property tests check both), and the allocation is
//! continuous in the demands: at `Σ dᵢ = R` both steps give every IF its
//! effective demand.
//!
//! # Quantization for the CPU form
//!
//! On a CPU host a share becomes a set of cores and an intra-op thread count
//! of the same size. [`cores_for`] rounds one share to the nearest whole
//! number of cores, at least one and at most all. [`split_cores`] turns a
//! whole allocation into disjoint core sets: it starts from [`cores_for`]
//! for every IF and, while the sets would need more cores than there are
//! (rounding up several half cores, or the one-core minimum), takes a core
//! from the IF that was rounded up the most. It never gives an IF more than
//! [`cores_for`] says, so cores can stay unassigned (for the `if-manager`'s
//! poll lcore, the OS, a shadow standby); when there are fewer cores than
//! IFs that is an error ([`CoreSplitError::NotEnoughCores`]). The caller
//! orders the core ids (NUMA-local to the NIC first); sets are consecutive
//! runs of that order, so an IF's cores are as local to each other as the
//! order makes them.
//!
//! On a GPU host the share is passed to MPS as a percentage, which the
//! driver applies at the granularity of whole SMs.
//!
//! # Limits
//!
//! - Shares are `f64`. The sum of an allocation never exceeds the capacity:
//!   the few ulps the level interpolation can leave above it are taken from
//!   the largest unpinned share. The one exception is pins that sum to more
//!   than the capacity by less than [`PIN_TOLERANCE_PCT`] (decimal input
//!   such as `33.3 + 33.3 + 33.4`), which are accepted as they are.
//! - When the pins take the whole capacity, unpinned IFs get 0%: the daemon
//!   must not run them (an MPS context or a core set cannot be empty).
//! - No hysteresis here: the allocation follows the claims exactly. Damping
//!   lives where the demands are made, in [`crate::tuning`].
//! - Finding the level costs `O(n²)` for `n` unpinned IFs, fine for the
//!   tens of IFs one device holds.

use serde::Serialize;
use thiserror::Error;

/// The whole device, in percent.
pub const DEVICE_PCT: f64 = 100.0;

/// Default floor of an unpinned IF ([`Claim::min_pct`]). 5% is a twentieth
/// of a GPU's SMs (6 of an H100's 132: enough for a small CNN to run at
/// all, if slowly), and with at most twenty IFs of equal weight on a device
/// every one of them gets it in full.
pub const DEFAULT_MIN_PCT: f64 = 5.0;

/// How far the pins may sum above the capacity and still be accepted, in
/// percentage points: enough to forgive the rounding of decimal input
/// (`33.3 + 33.3 + 33.4` is `100.00000000000001` in `f64`), far too little
/// to matter to any device.
pub const PIN_TOLERANCE_PCT: f64 = 1e-9;

/// What one IF asks for.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Claim {
    /// The IF.
    pub if_id: u16,
    /// Its weight in the fair share (its priority): finite, > 0. An IF of
    /// weight 2 gets twice the share of an IF of weight 1 when both want
    /// more than they get.
    pub weight: f64,
    /// Its elastic demand, from the self-tuning loop: in `[0, 100]`.
    pub demand_pct: f64,
    /// A share fixed by the user: in `(0, 100]`. Respected exactly, never
    /// changed by the allocator; weight, demand and floor are then unused.
    pub pinned_pct: Option<f64>,
    /// Its floor, in `[0, 100]`: it gets at least `min(min_pct, weighted
    /// equal split of what the pins leave)`.
    pub min_pct: f64,
}

impl Claim {
    /// An unpinned claim of weight 1 with the default floor.
    pub fn elastic(if_id: u16, demand_pct: f64) -> Self {
        Claim {
            if_id,
            weight: 1.0,
            demand_pct,
            pinned_pct: None,
            min_pct: DEFAULT_MIN_PCT,
        }
    }

    /// A claim pinned at `pinned_pct`.
    pub fn pinned(if_id: u16, pinned_pct: f64) -> Self {
        Claim {
            pinned_pct: Some(pinned_pct),
            ..Claim::elastic(if_id, pinned_pct)
        }
    }

    /// The same claim with weight `weight`.
    pub fn with_weight(self, weight: f64) -> Self {
        Claim { weight, ..self }
    }

    /// The same claim with floor `min_pct`.
    pub fn with_min_pct(self, min_pct: f64) -> Self {
        Claim { min_pct, ..self }
    }

    fn validate(&self) -> Result<(), AllocError> {
        let check = |field: &'static str, value: f64, ok: bool, range: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(AllocError::InvalidClaim {
                    if_id: self.if_id,
                    field,
                    value,
                    range,
                })
            }
        };
        let w = self.weight;
        check("weight", w, w > 0.0 && w.is_finite(), "(0, inf)")?;
        let d = self.demand_pct;
        check("demand_pct", d, (0.0..=DEVICE_PCT).contains(&d), "[0, 100]")?;
        let m = self.min_pct;
        check("min_pct", m, (0.0..=DEVICE_PCT).contains(&m), "[0, 100]")?;
        if let Some(p) = self.pinned_pct {
            check("pinned_pct", p, p > 0.0 && p <= DEVICE_PCT, "(0, 100]")?;
        }
        Ok(())
    }
}

/// Configuration of a [`ShareAllocator`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AllocConfig {
    /// What the allocator hands out, in `(0, 100]`. Default 100: the whole
    /// device. Lower it to keep room outside the allocation (a shadow
    /// standby during a switchover, a tenant the orchestrator does not
    /// manage).
    pub capacity_pct: f64,
    /// Give what the demands leave to the IFs (water-filled by weight)
    /// rather than leave the device idle. Default on; see the module docs
    /// for what it costs.
    pub work_conserving: bool,
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig {
            capacity_pct: DEVICE_PCT,
            work_conserving: true,
        }
    }
}

impl AllocConfig {
    /// Checks the capacity's range.
    pub fn validate(&self) -> Result<(), AllocError> {
        let c = self.capacity_pct;
        if c > 0.0 && c <= DEVICE_PCT {
            Ok(())
        } else {
            Err(AllocError::InvalidCapacity { capacity_pct: c })
        }
    }
}

/// Why an allocation was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq)]
pub enum AllocError {
    /// [`AllocConfig::capacity_pct`] is outside `(0, 100]`.
    #[error("capacity_pct = {capacity_pct} is outside (0, 100]")]
    InvalidCapacity {
        /// The value.
        capacity_pct: f64,
    },
    /// A field of a claim is outside its range.
    #[error("IF {if_id}: {field} = {value} is outside {range}")]
    InvalidClaim {
        /// The IF.
        if_id: u16,
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The accepted range.
        range: &'static str,
    },
    /// Two claims name the same IF.
    #[error("IF {if_id} has more than one claim")]
    DuplicateIf {
        /// The IF.
        if_id: u16,
    },
    /// The pinned shares alone are more than the capacity.
    #[error("pinned shares sum to {pinned_pct}%, more than the capacity of {capacity_pct}%")]
    PinsExceedCapacity {
        /// Their sum.
        pinned_pct: f64,
        /// The capacity.
        capacity_pct: f64,
    },
}

/// What decided an IF's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The user's pin.
    Pinned,
    /// The floor `min(min_pct, weighted equal split)`, above what the
    /// water level or the demand would give.
    Floor,
    /// Its demand, in full.
    Demand,
    /// The water level: it wanted more, and more would have to come from an
    /// IF with a normalized share no larger than its own.
    Fair,
    /// Its demand plus part of the leftover (work-conserving only).
    Leftover,
}

/// One IF's share of the device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Share {
    /// The IF.
    pub if_id: u16,
    /// Its share, percent of the device.
    pub pct: f64,
    /// What decided it.
    pub basis: Basis,
}

/// The result of [`ShareAllocator::allocate`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Allocation {
    /// One share per claim, in the order of the claims.
    pub shares: Vec<Share>,
    /// The capacity that was shared.
    pub capacity_pct: f64,
    /// The sum of the pins.
    pub pinned_pct: f64,
    /// Capacity given to no IF: `capacity_pct − total_pct()`, at least 0.
    pub idle_pct: f64,
}

impl Allocation {
    /// The share of `if_id`, if it had a claim.
    pub fn get(&self, if_id: u16) -> Option<&Share> {
        self.shares.iter().find(|s| s.if_id == if_id)
    }

    /// The sum of all shares.
    pub fn total_pct(&self) -> f64 {
        total(&self.shares)
    }
}

fn total(shares: &[Share]) -> f64 {
    shares.iter().map(|s| s.pct).sum()
}

/// The weighted max-min fair allocator (see the module docs). Its default
/// has the default [`AllocConfig`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShareAllocator {
    cfg: AllocConfig,
}

/// One unpinned IF in a water-filling pass: `share(λ) = clamp(λ·w, lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Band {
    w: f64,
    lo: f64,
    hi: f64,
}

impl Band {
    fn at(&self, level: f64) -> f64 {
        (level * self.w).clamp(self.lo, self.hi)
    }
}

/// The level `λ ≥ 0` at which `Σ clamp(λ·w, lo, hi) = budget`; 0 when the
/// `lo`s alone reach the budget, the last kink when the `hi`s do not.
/// The sum is linear between consecutive kinks `lo/w`, `hi/w`, so the
/// level is interpolated on the first segment that reaches the budget.
fn water_level(bands: &[Band], budget: f64) -> f64 {
    let filled = |level: f64| bands.iter().map(|b| b.at(level)).sum::<f64>();
    let mut kinks: Vec<f64> = bands
        .iter()
        .flat_map(|b| [b.lo / b.w, b.hi / b.w])
        .collect();
    kinks.sort_by(f64::total_cmp);
    kinks.dedup();
    let (mut x0, mut g0) = (0.0, filled(0.0));
    if g0 >= budget {
        return 0.0;
    }
    for &x1 in kinks.iter().filter(|&&x| x > 0.0) {
        let g1 = filled(x1);
        if g1 >= budget {
            // g0 < budget <= g1, so the segment is not flat.
            return x0 + (x1 - x0) * (budget - g0) / (g1 - g0);
        }
        (x0, g0) = (x1, g1);
    }
    x0
}

impl ShareAllocator {
    /// An allocator for `cfg`.
    pub fn new(cfg: AllocConfig) -> Result<Self, AllocError> {
        cfg.validate()?;
        Ok(ShareAllocator { cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &AllocConfig {
        &self.cfg
    }

    /// Shares the capacity among `claims` (see the module docs). The result
    /// has one share per claim, in their order.
    pub fn allocate(&self, claims: &[Claim]) -> Result<Allocation, AllocError> {
        for c in claims {
            c.validate()?;
        }
        let mut ids: Vec<u16> = claims.iter().map(|c| c.if_id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(AllocError::DuplicateIf { if_id: w[0] });
        }

        let capacity = self.cfg.capacity_pct;
        let pinned: f64 = claims.iter().filter_map(|c| c.pinned_pct).sum();
        if pinned > capacity + PIN_TOLERANCE_PCT {
            return Err(AllocError::PinsExceedCapacity {
                pinned_pct: pinned,
                capacity_pct: capacity,
            });
        }
        let budget = (capacity - pinned).max(0.0);

        let mut shares: Vec<Share> = claims
            .iter()
            .map(|c| Share {
                if_id: c.if_id,
                pct: c.pinned_pct.unwrap_or(0.0),
                basis: Basis::Pinned,
            })
            .collect();
        let elastic: Vec<usize> = (0..claims.len())
            .filter(|&i| claims[i].pinned_pct.is_none())
            .collect();
        if !elastic.is_empty() {
            self.fill(claims, &elastic, budget, &mut shares);
            trim(&mut shares, capacity);
        }
        let idle_pct = (capacity - total(&shares)).max(0.0);
        Ok(Allocation {
            shares,
            capacity_pct: capacity,
            pinned_pct: pinned,
            idle_pct,
        })
    }

    /// Steps 2 to 4 of the module docs for the unpinned claims `elastic`.
    fn fill(&self, claims: &[Claim], elastic: &[usize], budget: f64, shares: &mut [Share]) {
        let total_w: f64 = elastic.iter().map(|&i| claims[i].weight).sum();
        let bands: Vec<Band> = elastic
            .iter()
            .map(|&i| {
                let c = &claims[i];
                let floor = c.min_pct.min(budget * c.weight / total_w);
                Band {
                    w: c.weight,
                    lo: floor,
                    hi: c.demand_pct.max(floor),
                }
            })
            .collect();
        let wanted: f64 = bands.iter().map(|b| b.hi).sum();
        if wanted >= budget {
            let level = water_level(&bands, budget);
            for (&i, b) in elastic.iter().zip(&bands) {
                let pct = b.at(level);
                let basis = if pct <= b.lo || (pct >= b.hi && b.hi > claims[i].demand_pct) {
                    Basis::Floor
                } else if pct >= b.hi {
                    Basis::Demand
                } else {
                    Basis::Fair
                };
                shares[i].pct = pct;
                shares[i].basis = basis;
            }
            return;
        }
        for (&i, b) in elastic.iter().zip(&bands) {
            shares[i].pct = b.hi;
            shares[i].basis = if b.hi > claims[i].demand_pct {
                Basis::Floor
            } else {
                Basis::Demand
            };
        }
        if self.cfg.work_conserving {
            let uncapped: Vec<Band> = bands
                .iter()
                .map(|b| Band {
                    w: b.w,
                    lo: b.hi,
                    hi: budget,
                })
                .collect();
            let level = water_level(&uncapped, budget);
            for (&i, b) in elastic.iter().zip(&uncapped) {
                let pct = b.at(level);
                if pct > b.lo {
                    shares[i].pct = pct;
                    shares[i].basis = Basis::Leftover;
                }
            }
        }
    }
}

/// Takes the few ulps by which float rounding of the level can leave the
/// sum above `limit` from the largest unpinned share.
fn trim(shares: &mut [Share], limit: f64) {
    for _ in 0..8 {
        let sum = total(shares);
        if sum <= limit {
            return;
        }
        let excess = (sum - limit).max(limit * f64::EPSILON);
        let largest = shares
            .iter_mut()
            .filter(|s| s.basis != Basis::Pinned)
            .max_by(|a, b| a.pct.total_cmp(&b.pct));
        match largest {
            Some(s) => s.pct = (s.pct - excess).max(0.0),
            None => return,
        }
    }
}

/// The number of cores for `share_pct` percent of `total_cores`: rounded to
/// the nearest (halves up), at least 1, at most `total_cores`. A share that
/// is not a number counts as 0. With `total_cores == 0` it is 0, the only
/// case below 1.
pub fn cores_for(share_pct: f64, total_cores: usize) -> usize {
    if total_cores == 0 {
        return 0;
    }
    let exact = share_pct / DEVICE_PCT * total_cores as f64;
    // `as` saturates: negative and NaN give 0, +inf gives usize::MAX.
    let nearest = exact.round() as usize;
    nearest.clamp(1, total_cores)
}

/// The cores of one IF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoreSet {
    /// The IF.
    pub if_id: u16,
    /// Its cores (ids from the caller's list, in its order); also its
    /// intra-op thread count.
    pub cores: Vec<usize>,
}

/// Why [`split_cores`] failed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum CoreSplitError {
    /// Every IF needs at least one core of its own.
    #[error("{ifs} IFs need at least one core each, only {cores} cores")]
    NotEnoughCores {
        /// IFs to place.
        ifs: usize,
        /// Cores available.
        cores: usize,
    },
    /// A core id appears twice in the list.
    #[error("core {core} is listed twice")]
    DuplicateCore {
        /// The core id.
        core: usize,
    },
}

/// Splits `core_ids` into disjoint sets, one per share, in the order of
/// `shares` (see "Quantization" in the module docs). Every IF gets at least
/// one core and at most [`cores_for`] its share; together they get at most
/// `core_ids.len()`. Each set is a run of consecutive entries of
/// `core_ids`, the first set at its start.
pub fn split_cores(core_ids: &[usize], shares: &[Share]) -> Result<Vec<CoreSet>, CoreSplitError> {
    let mut sorted = core_ids.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(CoreSplitError::DuplicateCore { core: w[0] });
    }
    let n = core_ids.len();
    if shares.len() > n {
        return Err(CoreSplitError::NotEnoughCores {
            ifs: shares.len(),
            cores: n,
        });
    }
    let exact: Vec<f64> = shares
        .iter()
        .map(|s| s.pct / DEVICE_PCT * n as f64)
        .collect();
    let mut counts: Vec<usize> = shares.iter().map(|s| cores_for(s.pct, n)).collect();
    while counts.iter().sum::<usize>() > n {
        // Some count is above 1, since there are at most n IFs. Take a core
        // from the IF rounded up the most; on a tie, from the later one.
        let (i, _) = counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 1)
            .map(|(i, &c)| (i, c as f64 - exact[i]))
            .fold(None, |best: Option<(usize, f64)>, (i, over)| match best {
                Some((_, b)) if b > over => best,
                _ => Some((i, over)),
            })
            .expect("more cores wanted than IFs means some IF has two");
        counts[i] -= 1;
    }
    let mut next = 0;
    Ok(shares
        .iter()
        .zip(counts)
        .map(|(s, c)| {
            let cores = core_ids[next..next + c].to_vec();
            next += c;
            CoreSet {
                if_id: s.if_id,
                cores,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Tolerance of the float comparisons in the properties, percentage
    /// points (or percentage points per unit weight).
    const EPS: f64 = 1e-7;

    fn alloc(claims: &[Claim]) -> Allocation {
        ShareAllocator::default().allocate(claims).expect("valid")
    }

    fn alloc_with(work_conserving: bool, claims: &[Claim]) -> Allocation {
        ShareAllocator::new(AllocConfig {
            capacity_pct: DEVICE_PCT,
            work_conserving,
        })
        .expect("valid config")
        .allocate(claims)
        .expect("valid claims")
    }

    fn pcts(a: &Allocation) -> Vec<f64> {
        a.shares.iter().map(|s| s.pct).collect()
    }

    fn bases(a: &Allocation) -> Vec<Basis> {
        a.shares.iter().map(|s| s.basis).collect()
    }

    fn assert_pcts(a: &Allocation, want: &[f64]) {
        let got = pcts(a);
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{got:?} vs {want:?}");
        }
    }

    // ---- worked examples ------------------------------------------------

    #[test]
    fn demands_below_their_fair_share_are_met_and_the_rest_is_water_filled() {
        // 100% among three equal IFs wanting 20, 30 and 80: the first two
        // are capped by their demand (below the 33.3 equal split), the third
        // gets everything they leave.
        let a = alloc(&[
            Claim::elastic(1, 20.0),
            Claim::elastic(2, 30.0),
            Claim::elastic(3, 80.0),
        ]);
        assert_pcts(&a, &[20.0, 30.0, 50.0]);
        assert_eq!(bases(&a), [Basis::Demand, Basis::Demand, Basis::Fair]);
        assert_eq!(a.idle_pct, 0.0);
    }

    #[test]
    fn weights_scale_the_fair_share() {
        let a = alloc(&[
            Claim::elastic(1, 100.0),
            Claim::elastic(2, 100.0).with_weight(3.0),
        ]);
        assert_pcts(&a, &[25.0, 75.0]);
        assert_eq!(bases(&a), [Basis::Fair, Basis::Fair]);
        // Weight 1, 2, 1 wanting 50, 60, 10: the third is capped at 10; the
        // 90 left go 1:2 between the first two, 30 and 60, and 60 is
        // exactly the second's demand.
        let a = alloc(&[
            Claim::elastic(1, 50.0),
            Claim::elastic(2, 60.0).with_weight(2.0),
            Claim::elastic(3, 10.0),
        ]);
        assert_pcts(&a, &[30.0, 60.0, 10.0]);
    }

    #[test]
    fn leftovers_go_to_the_smallest_normalized_share_when_work_conserving() {
        // Demands 10 and 60 leave 30. Water-filled: the first rises to 40,
        // where the two would be equal; the second keeps its 60.
        let claims = [Claim::elastic(1, 10.0), Claim::elastic(2, 60.0)];
        let a = alloc_with(true, &claims);
        assert_pcts(&a, &[40.0, 60.0]);
        assert_eq!(bases(&a), [Basis::Leftover, Basis::Demand]);
        assert_eq!(a.idle_pct, 0.0);
        // Without work conservation the 30 stay idle.
        let a = alloc_with(false, &claims);
        assert_pcts(&a, &[10.0, 60.0]);
        assert_eq!(bases(&a), [Basis::Demand, Basis::Demand]);
        assert!((a.idle_pct - 30.0).abs() < 1e-9);
        // Two small demands: both rise to the equal split.
        let a = alloc_with(true, &[Claim::elastic(1, 10.0), Claim::elastic(2, 20.0)]);
        assert_pcts(&a, &[50.0, 50.0]);
    }

    #[test]
    fn pins_are_taken_first_and_exactly() {
        let a = alloc(&[
            Claim::elastic(1, 40.0),
            Claim::pinned(2, 50.0),
            Claim::elastic(3, 40.0),
        ]);
        assert_pcts(&a, &[25.0, 50.0, 25.0]);
        assert_eq!(bases(&a), [Basis::Fair, Basis::Pinned, Basis::Fair]);
        assert_eq!(a.pinned_pct, 50.0);
        // Only pins: what they leave is idle, even when work-conserving.
        let a = alloc(&[Claim::pinned(1, 30.0), Claim::pinned(2, 20.0)]);
        assert_pcts(&a, &[30.0, 20.0]);
        assert_eq!(a.idle_pct, 50.0);
    }

    #[test]
    fn pins_above_capacity_are_an_error() {
        let err = ShareAllocator::default()
            .allocate(&[Claim::pinned(1, 60.0), Claim::pinned(2, 50.0)])
            .unwrap_err();
        assert_eq!(
            err,
            AllocError::PinsExceedCapacity {
                pinned_pct: 110.0,
                capacity_pct: 100.0
            }
        );
        assert_eq!(
            err.to_string(),
            "pinned shares sum to 110%, more than the capacity of 100%"
        );
        // Decimal input that sums to 100 plus an ulp is accepted as is.
        let a = alloc(&[
            Claim::pinned(1, 33.3),
            Claim::pinned(2, 33.3),
            Claim::pinned(3, 33.4),
            Claim::elastic(4, 50.0),
        ]);
        assert_eq!(a.get(4).map(|s| s.pct), Some(0.0));
    }

    #[test]
    fn the_floor_is_kept_but_never_above_the_equal_split() {
        // An idle IF (demand 0) keeps its 5% floor; the other gets the rest.
        let a = alloc_with(false, &[Claim::elastic(1, 0.0), Claim::elastic(2, 100.0)]);
        assert_pcts(&a, &[5.0, 95.0]);
        assert_eq!(bases(&a), [Basis::Floor, Basis::Fair]);
        // Floors above the demand beat the demand.
        let a = alloc(&[
            Claim::elastic(1, 1.0),
            Claim::elastic(2, 1.0),
            Claim::elastic(3, 1.0),
            Claim::elastic(4, 100.0),
        ]);
        assert_pcts(&a, &[5.0, 5.0, 5.0, 85.0]);
        assert_eq!(
            bases(&a),
            [Basis::Floor, Basis::Floor, Basis::Floor, Basis::Fair]
        );
        // Thirty IFs with a 5% floor cannot all have it: each gets the equal
        // split, 100/30.
        let claims: Vec<Claim> = (0..30).map(|i| Claim::elastic(i, 100.0)).collect();
        let a = alloc(&claims);
        for s in &a.shares {
            assert!((s.pct - 100.0 / 30.0).abs() < 1e-9, "{s:?}");
        }
        assert!(a.total_pct() <= 100.0);
    }

    #[test]
    fn a_lower_capacity_is_respected() {
        let a = ShareAllocator::new(AllocConfig {
            capacity_pct: 80.0,
            work_conserving: true,
        })
        .unwrap()
        .allocate(&[Claim::elastic(1, 10.0), Claim::elastic(2, 10.0)])
        .unwrap();
        assert_pcts(&a, &[40.0, 40.0]);
        assert_eq!(a.capacity_pct, 80.0);
    }

    #[test]
    fn no_claims_leave_the_device_idle() {
        let a = alloc(&[]);
        assert!(a.shares.is_empty());
        assert_eq!(a.idle_pct, 100.0);
    }

    #[test]
    fn invalid_input_is_refused_with_its_reason() {
        let bad = |c: Claim| ShareAllocator::default().allocate(&[c]).unwrap_err();
        assert!(matches!(
            bad(Claim::elastic(7, 10.0).with_weight(0.0)),
            AllocError::InvalidClaim {
                if_id: 7,
                field: "weight",
                ..
            }
        ));
        assert!(matches!(
            bad(Claim::elastic(7, f64::NAN)),
            AllocError::InvalidClaim {
                field: "demand_pct",
                ..
            }
        ));
        assert!(matches!(
            bad(Claim::elastic(7, 120.0)),
            AllocError::InvalidClaim {
                field: "demand_pct",
                ..
            }
        ));
        assert!(matches!(
            bad(Claim::elastic(7, 10.0).with_min_pct(-1.0)),
            AllocError::InvalidClaim {
                field: "min_pct",
                ..
            }
        ));
        assert!(matches!(
            bad(Claim::pinned(7, 0.0)),
            AllocError::InvalidClaim {
                field: "pinned_pct",
                ..
            }
        ));
        let dup = ShareAllocator::default()
            .allocate(&[Claim::elastic(3, 1.0), Claim::elastic(3, 2.0)])
            .unwrap_err();
        assert_eq!(dup, AllocError::DuplicateIf { if_id: 3 });
        for capacity_pct in [0.0, -5.0, 100.5, f64::NAN] {
            let cfg = AllocConfig {
                capacity_pct,
                work_conserving: true,
            };
            assert!(ShareAllocator::new(cfg).is_err(), "{capacity_pct}");
        }
    }

    #[test]
    fn an_allocation_serializes_for_the_log() {
        let a = alloc(&[Claim::elastic(1, 30.0), Claim::pinned(2, 20.0)]);
        let v: serde_json::Value = serde_json::to_value(&a).unwrap();
        assert_eq!(v["shares"][1]["basis"], "pinned");
        assert_eq!(v["shares"][0]["basis"], "leftover");
        assert_eq!(v["shares"][0]["pct"], 80.0);
    }

    #[test]
    fn cores_for_rounds_to_the_nearest_core() {
        assert_eq!(cores_for(50.0, 8), 4);
        assert_eq!(cores_for(100.0, 8), 8);
        assert_eq!(cores_for(150.0, 8), 8);
        assert_eq!(cores_for(1.0, 8), 1, "at least one core");
        assert_eq!(cores_for(0.0, 4), 1);
        assert_eq!(cores_for(-3.0, 4), 1);
        assert_eq!(cores_for(f64::NAN, 4), 1);
        assert_eq!(cores_for(f64::INFINITY, 4), 4);
        assert_eq!(cores_for(18.75, 8), 2, "1.5 cores round up");
        assert_eq!(cores_for(18.7, 8), 1, "1.496 cores round down");
        assert_eq!(cores_for(30.0, 2), 1);
        assert_eq!(cores_for(50.0, 0), 0, "no cores at all");
    }

    fn share(if_id: u16, pct: f64) -> Share {
        Share {
            if_id,
            pct,
            basis: Basis::Fair,
        }
    }

    #[test]
    fn split_cores_gives_consecutive_disjoint_runs() {
        let cores: Vec<usize> = (0..8).collect();
        let sets = split_cores(&cores, &[share(1, 50.0), share(2, 25.0), share(3, 25.0)]).unwrap();
        assert_eq!(
            sets,
            [
                CoreSet {
                    if_id: 1,
                    cores: vec![0, 1, 2, 3]
                },
                CoreSet {
                    if_id: 2,
                    cores: vec![4, 5]
                },
                CoreSet {
                    if_id: 3,
                    cores: vec![6, 7]
                },
            ]
        );
        // Shares below the device leave cores free.
        let sets = split_cores(&cores, &[share(1, 30.0), share(2, 20.0)]).unwrap();
        assert_eq!(sets[0].cores, [0, 1]);
        assert_eq!(sets[1].cores, [2, 3]);
    }

    #[test]
    fn split_cores_takes_back_what_rounding_overspends() {
        // 50/50 of 3 cores: both round 1.5 up to 2; the later IF gives one
        // back.
        let sets = split_cores(&[4, 5, 6], &[share(1, 50.0), share(2, 50.0)]).unwrap();
        assert_eq!(sets[0].cores, [4, 5]);
        assert_eq!(sets[1].cores, [6]);
        // 90/5/5 of 4 cores: 3.6 -> 4, and the one-core minimum of the
        // others makes 6; the first (the most rounded up) gives two back.
        let sets = split_cores(
            &[0, 1, 2, 3],
            &[share(1, 90.0), share(2, 5.0), share(3, 5.0)],
        )
        .unwrap();
        let counts: Vec<usize> = sets.iter().map(|s| s.cores.len()).collect();
        assert_eq!(counts, [2, 1, 1]);
    }

    #[test]
    fn split_cores_says_when_cores_run_out() {
        let err = split_cores(&[0, 1], &[share(1, 10.0), share(2, 10.0), share(3, 10.0)]);
        assert_eq!(
            err,
            Err(CoreSplitError::NotEnoughCores { ifs: 3, cores: 2 })
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "3 IFs need at least one core each, only 2 cores"
        );
        assert_eq!(
            split_cores(&[0, 1, 0], &[share(1, 10.0)]),
            Err(CoreSplitError::DuplicateCore { core: 0 })
        );
        assert_eq!(split_cores(&[], &[]), Ok(vec![]));
    }

    // ---- properties -----------------------------------------------------

    /// Claims with distinct ids; pins are whole percents (as a user writes
    /// them), so that "never above capacity" can be checked exactly.
    fn claims_strategy() -> impl Strategy<Value = Vec<Claim>> {
        let demand = prop_oneof![
            1 => Just(0.0),
            1 => Just(100.0),
            6 => 0.0..=100.0f64,
        ];
        let claim = (
            0.1..10.0f64,
            demand,
            prop::option::weighted(0.2, 1u32..=60),
            prop_oneof![Just(0.0), Just(DEFAULT_MIN_PCT), 0.0..20.0f64],
        );
        prop::collection::vec(claim, 0..10).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (weight, demand_pct, pin, min_pct))| Claim {
                    if_id: i as u16,
                    weight,
                    demand_pct,
                    pinned_pct: pin.map(f64::from),
                    min_pct,
                })
                .collect()
        })
    }

    fn config_strategy() -> impl Strategy<Value = AllocConfig> {
        (prop_oneof![Just(100u32), 50u32..=100], any::<bool>()).prop_map(|(c, wc)| AllocConfig {
            capacity_pct: f64::from(c),
            work_conserving: wc,
        })
    }

    /// The floor of every unpinned claim, recomputed from the definition.
    fn floors(cfg: &AllocConfig, claims: &[Claim]) -> Vec<f64> {
        let pinned: f64 = claims.iter().filter_map(|c| c.pinned_pct).sum();
        let budget = (cfg.capacity_pct - pinned).max(0.0);
        let total_w: f64 = claims
            .iter()
            .filter(|c| c.pinned_pct.is_none())
            .map(|c| c.weight)
            .sum();
        claims
            .iter()
            .map(|c| c.min_pct.min(budget * c.weight / total_w))
            .collect()
    }

    /// Every property of one allocation that does not need a second one.
    fn check(cfg: &AllocConfig, claims: &[Claim], a: &Allocation) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.shares.len(), claims.len());
        let total = a.total_pct();
        prop_assert!(total <= cfg.capacity_pct, "total {} > capacity", total);
        prop_assert!(a.idle_pct >= 0.0);
        let floor = floors(cfg, claims);
        let eff: Vec<f64> = claims
            .iter()
            .zip(&floor)
            .map(|(c, f)| c.demand_pct.max(*f))
            .collect();
        let unpinned: Vec<usize> = (0..claims.len())
            .filter(|&i| claims[i].pinned_pct.is_none())
            .collect();
        for (i, (c, s)) in claims.iter().zip(&a.shares).enumerate() {
            prop_assert_eq!(s.if_id, c.if_id);
            prop_assert!(s.pct.is_finite() && s.pct >= 0.0, "{:?}", s);
            match c.pinned_pct {
                Some(p) => {
                    prop_assert_eq!(s.pct, p, "pin changed");
                    prop_assert_eq!(s.basis, Basis::Pinned);
                }
                None => {
                    prop_assert!(s.pct >= floor[i] - EPS, "{:?} below floor {}", s, floor[i]);
                    if !cfg.work_conserving {
                        prop_assert!(s.pct <= eff[i] + EPS, "{:?} above demand {}", s, eff[i]);
                    }
                }
            }
        }
        if unpinned.is_empty() {
            return Ok(());
        }
        let below_demand = |i: usize| a.shares[i].pct < claims[i].demand_pct - EPS;
        let norm = |i: usize| a.shares[i].pct / claims[i].weight;
        // The device never idles while an IF wants more, nor at all when
        // work-conserving.
        if cfg.work_conserving || unpinned.iter().any(|&i| below_demand(i)) {
            prop_assert!(
                (total - cfg.capacity_pct).abs() < 1e-6,
                "idle {} with demand unmet or work-conserving",
                cfg.capacity_pct - total
            );
        }
        // Max-min fairness: an IF below its demand could only get more from
        // an IF with a larger normalized share if that one is at its floor.
        for &i in unpinned.iter().filter(|&&i| below_demand(i)) {
            for &j in &unpinned {
                if norm(j) > norm(i) + EPS * (1.0 + norm(i)) {
                    prop_assert!(
                        a.shares[j].pct <= floor[j] + EPS,
                        "IF {} ({:?}, below demand) could take from IF {} ({:?})",
                        i,
                        a.shares[i],
                        j,
                        a.shares[j]
                    );
                }
            }
        }
        // Leftovers are water-filled: an IF raised above its demand is never
        // raised past the normalized share of another IF.
        if cfg.work_conserving {
            for &i in &unpinned {
                for &j in &unpinned {
                    if norm(j) > norm(i) + EPS * (1.0 + norm(i)) {
                        prop_assert!(
                            a.shares[j].pct <= eff[j] + EPS,
                            "leftover to IF {} ({:?}) above IF {} ({:?})",
                            j,
                            a.shares[j],
                            i,
                            a.shares[i]
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The textbook progressive filling for the plain case (no pins, no
    /// floors, not work-conserving): the obviously-correct slow version.
    fn progressive_filling(claims: &[Claim], capacity: f64) -> Vec<f64> {
        let mut share = vec![0.0; claims.len()];
        let mut active: Vec<usize> = (0..claims.len()).collect();
        let mut left = capacity;
        loop {
            let w: f64 = active.iter().map(|&i| claims[i].weight).sum();
            let (done, rest): (Vec<usize>, Vec<usize>) = active
                .iter()
                .partition(|&&i| claims[i].demand_pct <= left * claims[i].weight / w);
            if done.is_empty() {
                for &i in &active {
                    share[i] = left * claims[i].weight / w;
                }
                return share;
            }
            for &i in &done {
                share[i] = claims[i].demand_pct;
                left -= claims[i].demand_pct;
            }
            if rest.is_empty() {
                return share;
            }
            active = rest;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn allocations_keep_every_invariant(cfg in config_strategy(), claims in claims_strategy()) {
            let pinned: f64 = claims.iter().filter_map(|c| c.pinned_pct).sum();
            let result = ShareAllocator::new(cfg).unwrap().allocate(&claims);
            if pinned > cfg.capacity_pct {
                prop_assert!(matches!(result, Err(AllocError::PinsExceedCapacity { .. })), "{:?}", result);
            } else {
                check(&cfg, &claims, &result.expect("valid claims"))?;
            }
        }

        #[test]
        fn raising_a_demand_never_lowers_that_share_nor_raises_another(
            cfg in config_strategy(),
            claims in claims_strategy().prop_filter("some claim", |c| !c.is_empty()),
            pick in any::<prop::sample::Index>(),
            raise in 0.0..100.0f64,
        ) {
            let allocator = ShareAllocator::new(cfg).unwrap();
            let Ok(before) = allocator.allocate(&claims) else { return Ok(()) };
            let k = pick.index(claims.len());
            let mut more = claims.clone();
            more[k].demand_pct = (more[k].demand_pct + raise).min(DEVICE_PCT);
            let after = allocator.allocate(&more).expect("same pins");
            check(&cfg, &more, &after)?;
            prop_assert!(
                after.shares[k].pct >= before.shares[k].pct - EPS,
                "{:?} -> {:?}", before.shares[k], after.shares[k]
            );
            for (j, (b, a)) in before.shares.iter().zip(&after.shares).enumerate() {
                if j != k {
                    prop_assert!(a.pct <= b.pct + EPS, "IF {} rose: {:?} -> {:?}", j, b, a);
                }
            }
        }

        #[test]
        fn water_filling_matches_progressive_filling(
            claims in claims_strategy(),
            capacity in 50u32..=100,
        ) {
            let claims: Vec<Claim> = claims
                .into_iter()
                .map(|c| Claim { pinned_pct: None, min_pct: 0.0, ..c })
                .collect();
            let capacity = f64::from(capacity);
            let a = ShareAllocator::new(AllocConfig { capacity_pct: capacity, work_conserving: false })
                .unwrap()
                .allocate(&claims)
                .unwrap();
            let want = progressive_filling(&claims, capacity);
            for (s, w) in a.shares.iter().zip(&want) {
                prop_assert!((s.pct - w).abs() < 1e-6, "{:?} vs {:?}", pcts(&a), want);
            }
        }

        #[test]
        fn split_cores_is_disjoint_bounded_and_complete(
            n in 0usize..24,
            pcts in prop::collection::vec(0.0..=100.0f64, 0..12),
        ) {
            // Distinct, unordered ids.
            let cores: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % 97 + 100 * (i % 2)).collect();
            let shares: Vec<Share> = pcts.iter().enumerate().map(|(i, &p)| share(i as u16, p)).collect();
            match split_cores(&cores, &shares) {
                Err(e) => prop_assert_eq!(e, CoreSplitError::NotEnoughCores { ifs: shares.len(), cores: n }),
                Ok(sets) => {
                    prop_assert!(shares.len() <= n);
                    prop_assert_eq!(sets.len(), shares.len());
                    let used: Vec<usize> = sets.iter().flat_map(|s| s.cores.iter().copied()).collect();
                    prop_assert!(used.len() <= n);
                    // Consecutive runs from the start: disjoint by construction.
                    prop_assert_eq!(&used[..], &cores[..used.len()]);
                    for (s, sh) in sets.iter().zip(&shares) {
                        prop_assert_eq!(s.if_id, sh.if_id);
                        prop_assert!(!s.cores.is_empty());
                        prop_assert!(s.cores.len() <= cores_for(sh.pct, n));
                    }
                    // When the shares fit the device, rounding costs each IF
                    // at most one core below its exact share, plus what the
                    // others' one-core minimum takes.
                    let sum: f64 = pcts.iter().sum();
                    if sum <= DEVICE_PCT && shares.len() * 2 <= n {
                        for (s, &p) in sets.iter().zip(&pcts) {
                            let exact = p / DEVICE_PCT * n as f64;
                            prop_assert!(s.cores.len() as f64 >= exact - 1.0 - shares.len() as f64,
                                "{:?} for {}", s, exact);
                        }
                    }
                }
            }
        }
    }
}
