//! The desired state (which IFs run which model, with which SLO and share)
//! and the validation of commands against it.
//!
//! [`DesiredState::plan`] checks a [`Request`] against the state and the
//! [`ModelCatalog`] without touching either and returns the [`Change`] it
//! would make; [`DesiredState::apply`] makes it and cannot fail. A refused
//! command therefore never changes anything, and the daemon can act on a
//! planned change (start a process, begin a switchover) before it commits
//! it, or not commit it at all if acting failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kp_schema::model::{ConfigError, EngineKind, ModelConfig};
use kp_wire::IfId;
use serde::{Deserialize, Serialize};

use super::protocol::{ControlError, IfState, Reply, Request, StatusReport, StatusRow};

/// The initial share of an IF whose model has no knee profile, percent.
/// GSLICE starts an inference function at about a third of the GPU and lets
/// its self-tuning move it from there: it is the knee of most of the CNNs
/// of its evaluation at batch sizes up to 16.
pub const DEFAULT_SHARE_PCT: f64 = 30.0;

/// Pins may sum to 100% plus this much, so that shares written as decimals
/// (3 × 33.333…) are not refused for rounding.
const CAPACITY_SLACK_PCT: f64 = 1e-6;

/// What the orchestrator knows of one model of the repository.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogEntry {
    /// The model's name.
    pub name: String,
    /// The IF id its config gives it.
    pub if_id: u16,
    /// Its configured latency objective, ms.
    pub slo_ms: f64,
    /// The share at its knee, percent, if its profile says so.
    pub knee_share_pct: Option<f64>,
    /// The engine its config names (a GPU engine's share is an MPS
    /// percentage; any other's, cores).
    pub engine: EngineKind,
}

impl CatalogEntry {
    /// The entry for one loaded model config. The knee share is read from
    /// `[knee] share_pct` when that is a number in (0, 100]; the `[knee]`
    /// table's format is not fixed yet, so anything else there is ignored.
    pub fn from_config(config: &ModelConfig) -> CatalogEntry {
        let knee_share_pct = config
            .knee
            .as_ref()
            .and_then(|knee| knee.get("share_pct"))
            .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
            .filter(|&pct| valid_pct(pct));
        CatalogEntry {
            name: config.name.clone(),
            if_id: config.if_id.0,
            slo_ms: config.slo.as_secs_f64() * 1e3,
            knee_share_pct,
            engine: config.engine,
        }
    }
}

/// The models that can be deployed, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelCatalog {
    models: BTreeMap<String, CatalogEntry>,
}

impl ModelCatalog {
    /// An empty catalog.
    pub fn new() -> ModelCatalog {
        ModelCatalog::default()
    }

    /// The catalog of the model repository folder `dir`
    /// ([`kp_schema::model::repository`]).
    pub fn load(dir: impl AsRef<Path>) -> Result<ModelCatalog, ConfigError> {
        Ok(ModelCatalog::from_configs(&kp_schema::model::repository(
            dir,
        )?))
    }

    /// The catalog of already loaded configs.
    pub fn from_configs(configs: &[ModelConfig]) -> ModelCatalog {
        configs.iter().map(CatalogEntry::from_config).collect()
    }

    /// Adds or replaces a model.
    pub fn insert(&mut self, entry: CatalogEntry) {
        self.models.insert(entry.name.clone(), entry);
    }

    /// The model called `name`.
    pub fn get(&self, name: &str) -> Option<&CatalogEntry> {
        self.models.get(name)
    }

    /// Every model, by name.
    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.models.values()
    }

    /// How many models there are.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

impl FromIterator<CatalogEntry> for ModelCatalog {
    fn from_iter<I: IntoIterator<Item = CatalogEntry>>(iter: I) -> ModelCatalog {
        let mut catalog = ModelCatalog::new();
        for entry in iter {
            catalog.insert(entry);
        }
        catalog
    }
}

/// One IF as the orchestrator wants it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DesiredIf {
    /// The IF's id.
    pub if_id: u16,
    /// The model it serves.
    pub model: String,
    /// The IF binary it runs (absolute).
    pub binary: PathBuf,
    /// Latency objective, ms (finite, > 0).
    pub slo_ms: f64,
    /// Share of the device, percent, in (0, 100].
    pub share_pct: f64,
    /// Whether `share_pct` is pinned by hand (the allocator leaves it).
    pub pinned: bool,
}

/// What a valid command changes: the output of [`DesiredState::plan`], the
/// input of [`DesiredState::apply`], and what the daemon acts on.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Add `new` (start its process).
    Deploy {
        /// The IF to add.
        new: DesiredIf,
    },
    /// Remove `old` (stop its process).
    Retire {
        /// The IF removed, as it was.
        old: DesiredIf,
    },
    /// Replace `old` by `new` (same `if_id`): an SLO change, a pin or an
    /// unpin. A different `share_pct` needs a switchover.
    Update {
        /// The IF as it was.
        old: DesiredIf,
        /// The IF as it will be.
        new: DesiredIf,
    },
    /// Nothing changes; the daemon answers with its status report.
    Status,
    /// Stop taking changes; the daemon retires everything and exits.
    Shutdown,
}

impl Change {
    /// The documented `ok` reply for this change (`Status` needs the
    /// daemon's report: use [`Reply::status`]).
    pub fn reply(&self) -> Reply {
        match self {
            Change::Deploy { new } | Change::Update { new, .. } => {
                Reply::ok_with(&serde_json::json!({ "if": new }))
            }
            Change::Retire { old } => Reply::ok_with(&serde_json::json!({ "retired": old })),
            Change::Status => Reply::ok(),
            Change::Shutdown => Reply::ok_with(&serde_json::json!({ "shutting_down": true })),
        }
    }
}

/// Which IFs should run, and how. Changed only through
/// [`plan`](DesiredState::plan) + [`apply`](DesiredState::apply) and the
/// daemon's own bookkeeping ([`set_busy`](DesiredState::set_busy),
/// [`set_share`](DesiredState::set_share)).
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredState {
    default_binary: PathBuf,
    ifs: BTreeMap<u16, DesiredIf>,
    /// IFs with a change in progress (starting, switching over, retiring),
    /// and what it is. Kept apart from `ifs`: a retired IF stays busy until
    /// its process is gone.
    busy: BTreeMap<u16, String>,
    shutting_down: bool,
}

impl DesiredState {
    /// No IFs; `deploy` without a `binary` runs `default_binary`.
    pub fn new(default_binary: impl Into<PathBuf>) -> DesiredState {
        DesiredState {
            default_binary: default_binary.into(),
            ifs: BTreeMap::new(),
            busy: BTreeMap::new(),
            shutting_down: false,
        }
    }

    /// The binary `deploy` runs by default.
    pub fn default_binary(&self) -> &Path {
        &self.default_binary
    }

    /// Every IF, by id.
    pub fn ifs(&self) -> impl Iterator<Item = &DesiredIf> {
        self.ifs.values()
    }

    /// The IF `if_id`.
    pub fn get(&self, if_id: u16) -> Option<&DesiredIf> {
        self.ifs.get(&if_id)
    }

    /// What is in progress for `if_id`, if anything.
    pub fn busy(&self, if_id: u16) -> Option<&str> {
        self.busy.get(&if_id).map(String::as_str)
    }

    /// Whether `shutdown` was applied.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// The sum of the pinned shares, percent.
    pub fn pinned_pct(&self) -> f64 {
        self.ifs
            .values()
            .filter(|d| d.pinned)
            .map(|d| d.share_pct)
            .sum()
    }

    /// The daemon marks `if_id` busy while it carries out a change (`what`,
    /// e.g. "starting", "switching over to 40%", "retiring"): commands that
    /// change the IF are refused with `busy` until [`clear_busy`]. The id
    /// need not be deployed (a retired IF is busy until its process exits).
    ///
    /// [`clear_busy`]: DesiredState::clear_busy
    pub fn set_busy(&mut self, if_id: u16, what: impl Into<String>) {
        self.busy.insert(if_id, what.into());
    }

    /// The change to `if_id` is done (or failed and was given up).
    pub fn clear_busy(&mut self, if_id: u16) {
        self.busy.remove(&if_id);
    }

    /// Records the allocator's share for an unpinned IF. Returns false and
    /// changes nothing if `if_id` is not deployed, is pinned, or `pct` is
    /// not in (0, 100].
    pub fn set_share(&mut self, if_id: u16, pct: f64) -> bool {
        match self.ifs.get_mut(&if_id) {
            Some(d) if !d.pinned && valid_pct(pct) => {
                d.share_pct = pct;
                true
            }
            _ => false,
        }
    }

    /// Validates `request` against this state and `models` and returns what
    /// it would change, touching nothing. A refusal says why.
    ///
    /// Checks run from the request alone (values), to the catalog, to the
    /// state; `status` and `shutdown` are always accepted.
    pub fn plan(&self, request: &Request, models: &ModelCatalog) -> Result<Change, ControlError> {
        match request {
            Request::Status => return Ok(Change::Status),
            Request::Shutdown => return Ok(Change::Shutdown),
            _ if self.shutting_down => return Err(ControlError::ShuttingDown),
            _ => {}
        }
        match request {
            Request::Deploy {
                if_id,
                model,
                binary,
                slo_ms,
                share_pct,
            } => {
                let if_id = *if_id;
                if let Some(slo) = *slo_ms {
                    check_slo(slo)?;
                }
                if let Some(pct) = *share_pct {
                    check_pct("share_pct", pct)?;
                }
                if let Some(path) = binary {
                    if !path.is_absolute() {
                        return Err(ControlError::InvalidValue {
                            field: "binary",
                            value: format!("{:?}", path.display().to_string()),
                            reason: "must be an absolute path (the daemon's working directory is not yours)",
                        });
                    }
                }
                let entry = models
                    .get(model)
                    .ok_or_else(|| ControlError::UnknownModel {
                        model: model.clone(),
                        known: known_models(models),
                    })?;
                if entry.if_id != if_id {
                    return Err(ControlError::IfIdMismatch {
                        model: model.clone(),
                        requested: IfId(if_id),
                        configured: IfId(entry.if_id),
                    });
                }
                if let Some(d) = self.ifs.get(&if_id) {
                    return Err(ControlError::AlreadyDeployed {
                        if_id: IfId(if_id),
                        model: d.model.clone(),
                    });
                }
                self.check_idle(if_id)?;
                Ok(Change::Deploy {
                    new: DesiredIf {
                        if_id,
                        model: model.clone(),
                        binary: binary
                            .clone()
                            .unwrap_or_else(|| self.default_binary.clone()),
                        slo_ms: slo_ms.unwrap_or(entry.slo_ms),
                        share_pct: share_pct
                            .or(entry.knee_share_pct)
                            .unwrap_or(DEFAULT_SHARE_PCT),
                        pinned: false,
                    },
                })
            }
            Request::Retire { if_id } => {
                let old = self.deployed(*if_id)?;
                self.check_idle(*if_id)?;
                Ok(Change::Retire { old: old.clone() })
            }
            Request::Slo { if_id, slo_ms } => {
                check_slo(*slo_ms)?;
                let old = self.deployed(*if_id)?;
                self.check_idle(*if_id)?;
                let new = DesiredIf {
                    slo_ms: *slo_ms,
                    ..old.clone()
                };
                Ok(Change::Update {
                    old: old.clone(),
                    new,
                })
            }
            Request::Share { if_id, pct } => {
                check_pct("pct", *pct)?;
                let old = self.deployed(*if_id)?;
                self.check_idle(*if_id)?;
                let others: f64 = self
                    .ifs
                    .values()
                    .filter(|d| d.pinned && d.if_id != *if_id)
                    .map(|d| d.share_pct)
                    .sum();
                let total = others + pct;
                if total > 100.0 + CAPACITY_SLACK_PCT {
                    return Err(ControlError::OverCapacity {
                        if_id: IfId(*if_id),
                        pct: *pct,
                        others,
                        total,
                    });
                }
                let new = DesiredIf {
                    share_pct: *pct,
                    pinned: true,
                    ..old.clone()
                };
                Ok(Change::Update {
                    old: old.clone(),
                    new,
                })
            }
            Request::Unpin { if_id } => {
                let old = self.deployed(*if_id)?;
                if !old.pinned {
                    return Err(ControlError::NotPinned {
                        if_id: IfId(*if_id),
                    });
                }
                self.check_idle(*if_id)?;
                let new = DesiredIf {
                    pinned: false,
                    ..old.clone()
                };
                Ok(Change::Update {
                    old: old.clone(),
                    new,
                })
            }
            Request::Status | Request::Shutdown => unreachable!("answered above"),
        }
    }

    /// Makes a change that [`plan`](DesiredState::plan) returned for this
    /// state. Cannot fail. (A change planned against another state is
    /// applied as it says: `Deploy`/`Update` store `new`, `Retire` removes
    /// the id.)
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::Deploy { new } | Change::Update { new, .. } => {
                self.ifs.insert(new.if_id, new);
            }
            Change::Retire { old } => {
                self.ifs.remove(&old.if_id);
            }
            Change::Status => {}
            Change::Shutdown => self.shutting_down = true,
        }
    }

    fn deployed(&self, if_id: u16) -> Result<&DesiredIf, ControlError> {
        self.ifs
            .get(&if_id)
            .ok_or(ControlError::UnknownIf { if_id: IfId(if_id) })
    }

    fn check_idle(&self, if_id: u16) -> Result<(), ControlError> {
        match self.busy.get(&if_id) {
            Some(what) => Err(ControlError::Busy {
                if_id: IfId(if_id),
                what: what.clone(),
            }),
            None => Ok(()),
        }
    }
}

fn valid_pct(pct: f64) -> bool {
    pct > 0.0 && pct <= 100.0
}

fn check_pct(field: &'static str, pct: f64) -> Result<(), ControlError> {
    if valid_pct(pct) {
        Ok(())
    } else {
        Err(ControlError::InvalidValue {
            field,
            value: pct.to_string(),
            reason: "a share must be more than 0 and at most 100 percent",
        })
    }
}

fn check_slo(slo_ms: f64) -> Result<(), ControlError> {
    if slo_ms.is_finite() && slo_ms > 0.0 {
        Ok(())
    } else {
        Err(ControlError::InvalidValue {
            field: "slo_ms",
            value: slo_ms.to_string(),
            reason: "an SLO must be a finite number of milliseconds above 0",
        })
    }
}

fn known_models(models: &ModelCatalog) -> String {
    if models.is_empty() {
        return "no models".into();
    }
    models
        .entries()
        .map(|e| format!("{} (if_id {})", e.name, e.if_id))
        .collect::<Vec<_>>()
        .join(", ")
}

// The status payload's constructors from the desired state live here, not
// in `protocol`: the wire types know nothing of the state, so the module
// dependency runs one way (state -> protocol).

impl StatusRow {
    /// A row for `desired` in `state`, with no process and no metrics yet;
    /// the daemon overlays what it measured.
    pub fn from_desired(desired: &DesiredIf, state: IfState) -> StatusRow {
        StatusRow {
            if_id: desired.if_id,
            model: desired.model.clone(),
            state,
            pid: None,
            share_pct: desired.share_pct,
            pinned: desired.pinned,
            slo_ms: desired.slo_ms,
            batch_size: None,
            mean_batch_size: None,
            throughput_rps: None,
            arrival_rps: None,
            p50_ms: None,
            p99_ms: None,
            slo_attainment: None,
            switchovers: 0,
            last_switchover_gap_us: None,
            reason: None,
        }
    }
}

impl StatusReport {
    /// The desired state alone: every IF `active` unless it is busy
    /// (`starting`). A base the daemon overlays with what it observes.
    pub fn from_desired(state: &DesiredState) -> StatusReport {
        StatusReport {
            platform: None,
            shutting_down: state.is_shutting_down(),
            ifs: state
                .ifs()
                .map(|d| {
                    let phase = if state.busy(d.if_id).is_some() {
                        IfState::Starting
                    } else {
                        IfState::Active
                    };
                    StatusRow::from_desired(d, phase)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::protocol::ErrorCode;
    use super::*;

    fn catalog() -> ModelCatalog {
        [
            CatalogEntry {
                name: "squeezenet".into(),
                if_id: 1,
                slo_ms: 20.0,
                knee_share_pct: None,
                engine: EngineKind::OnnxRuntime,
            },
            CatalogEntry {
                name: "resnet50".into(),
                if_id: 2,
                slo_ms: 200.0,
                knee_share_pct: Some(45.0),
                engine: EngineKind::OnnxRuntime,
            },
            CatalogEntry {
                name: "alexnet".into(),
                if_id: 3,
                slo_ms: 100.0,
                knee_share_pct: None,
                engine: EngineKind::OnnxRuntime,
            },
        ]
        .into_iter()
        .collect()
    }

    fn deploy(if_id: u16, model: &str) -> Request {
        Request::Deploy {
            if_id,
            model: model.into(),
            binary: None,
            slo_ms: None,
            share_pct: None,
        }
    }

    /// Plans and applies; panics on a refusal.
    fn run(state: &mut DesiredState, req: Request) {
        let change = state.plan(&req, &catalog()).expect("accepted");
        state.apply(change);
    }

    /// Asserts `req` is refused with `code` and that planning it left
    /// `state` as it was (plan takes `&self`; checked anyway, also through
    /// a clone, as the daemon sees it).
    fn refused(state: &DesiredState, req: Request, code: ErrorCode) -> ControlError {
        let before = state.clone();
        let err = state.plan(&req, &catalog()).expect_err("refused");
        assert_eq!(err.code(), code, "{req:?}: {err}");
        assert_eq!(*state, before);
        assert!(!err.to_string().is_empty());
        err
    }

    /// squeezenet (1) and resnet50 (2) deployed, resnet50 pinned at 60%.
    fn two() -> DesiredState {
        let mut s = DesiredState::new("/opt/kp/kp-if");
        run(&mut s, deploy(1, "squeezenet"));
        run(&mut s, deploy(2, "resnet50"));
        run(
            &mut s,
            Request::Share {
                if_id: 2,
                pct: 60.0,
            },
        );
        s
    }

    #[test]
    fn deploy_fills_defaults_from_the_catalog() {
        let s = two();
        let sq = s.get(1).unwrap();
        assert_eq!(sq.model, "squeezenet");
        assert_eq!(sq.binary, Path::new("/opt/kp/kp-if"));
        assert_eq!(sq.slo_ms, 20.0);
        assert_eq!(sq.share_pct, DEFAULT_SHARE_PCT);
        assert!(!sq.pinned);
        // resnet50's knee share, then pinned at 60.
        let mut fresh = DesiredState::new("/x");
        run(&mut fresh, deploy(2, "resnet50"));
        assert_eq!(fresh.get(2).unwrap().share_pct, 45.0);
        let rn = s.get(2).unwrap();
        assert_eq!((rn.share_pct, rn.pinned), (60.0, true));
        assert_eq!(s.pinned_pct(), 60.0);
    }

    #[test]
    fn deploy_takes_explicit_values() {
        let mut s = DesiredState::new("/x");
        let change = s
            .plan(
                &Request::Deploy {
                    if_id: 3,
                    model: "alexnet".into(),
                    binary: Some("/usr/local/bin/my-if".into()),
                    slo_ms: Some(55.5),
                    share_pct: Some(100.0),
                },
                &catalog(),
            )
            .unwrap();
        let Change::Deploy { new } = &change else {
            panic!("{change:?}")
        };
        assert_eq!(
            *new,
            DesiredIf {
                if_id: 3,
                model: "alexnet".into(),
                binary: "/usr/local/bin/my-if".into(),
                slo_ms: 55.5,
                share_pct: 100.0,
                pinned: false,
            }
        );
        assert_eq!(
            change.reply().to_json()["if"]["binary"],
            "/usr/local/bin/my-if"
        );
        s.apply(change);
        assert_eq!(s.ifs().count(), 1);
    }

    #[test]
    fn every_error_code_leaves_the_state_unchanged() {
        let s = two();
        // unknown_model, if_id_mismatch, already_deployed.
        let e = refused(&s, deploy(7, "nosuch"), ErrorCode::UnknownModel);
        assert!(e.to_string().contains("squeezenet (if_id 1)"), "{e}");
        refused(&s, deploy(2, "alexnet"), ErrorCode::IfIdMismatch);
        refused(&s, deploy(0, "alexnet"), ErrorCode::IfIdMismatch);
        refused(&s, deploy(1, "squeezenet"), ErrorCode::AlreadyDeployed);
        // unknown_if, for every command that names an IF.
        for req in [
            Request::Retire { if_id: 3 },
            Request::Slo {
                if_id: 3,
                slo_ms: 5.0,
            },
            Request::Share { if_id: 3, pct: 5.0 },
            Request::Unpin { if_id: 3 },
        ] {
            refused(&s, req, ErrorCode::UnknownIf);
        }
        // invalid_value.
        for slo in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            refused(
                &s,
                Request::Slo {
                    if_id: 1,
                    slo_ms: slo,
                },
                ErrorCode::InvalidValue,
            );
            refused(
                &s,
                Request::Deploy {
                    if_id: 3,
                    model: "alexnet".into(),
                    binary: None,
                    slo_ms: Some(slo),
                    share_pct: None,
                },
                ErrorCode::InvalidValue,
            );
        }
        for pct in [0.0, -5.0, 100.0001, 250.0, f64::NAN, f64::INFINITY] {
            refused(
                &s,
                Request::Share { if_id: 1, pct },
                ErrorCode::InvalidValue,
            );
            refused(
                &s,
                Request::Deploy {
                    if_id: 3,
                    model: "alexnet".into(),
                    binary: None,
                    slo_ms: None,
                    share_pct: Some(pct),
                },
                ErrorCode::InvalidValue,
            );
        }
        refused(
            &s,
            Request::Deploy {
                if_id: 3,
                model: "alexnet".into(),
                binary: Some("target/release/kp-if".into()),
                slo_ms: None,
                share_pct: None,
            },
            ErrorCode::InvalidValue,
        );
        // over_capacity: 60 pinned elsewhere.
        let e = refused(
            &s,
            Request::Share {
                if_id: 1,
                pct: 40.5,
            },
            ErrorCode::OverCapacity,
        );
        assert!(e.to_string().contains("100.5%"), "{e}");
        // not_pinned.
        refused(&s, Request::Unpin { if_id: 1 }, ErrorCode::NotPinned);
        // busy.
        let mut b = s.clone();
        b.set_busy(2, "switching over to 60%");
        let e = refused(&b, Request::Retire { if_id: 2 }, ErrorCode::Busy);
        assert!(e.to_string().contains("switching over to 60%"), "{e}");
        refused(
            &b,
            Request::Slo {
                if_id: 2,
                slo_ms: 9.0,
            },
            ErrorCode::Busy,
        );
        refused(&b, Request::Share { if_id: 2, pct: 9.0 }, ErrorCode::Busy);
        refused(&b, Request::Unpin { if_id: 2 }, ErrorCode::Busy);
        // A retired IF that is still stopping cannot be deployed again yet.
        let mut r = s.clone();
        run(&mut r, Request::Retire { if_id: 1 });
        r.set_busy(1, "retiring");
        refused(&r, deploy(1, "squeezenet"), ErrorCode::Busy);
        r.clear_busy(1);
        run(&mut r, deploy(1, "squeezenet"));
        // shutting_down: every change refused, status still answered.
        let mut d = s.clone();
        run(&mut d, Request::Shutdown);
        assert!(d.is_shutting_down());
        for req in [
            deploy(3, "alexnet"),
            Request::Retire { if_id: 1 },
            Request::Slo {
                if_id: 1,
                slo_ms: 5.0,
            },
            Request::Share { if_id: 1, pct: 5.0 },
            Request::Unpin { if_id: 2 },
        ] {
            refused(&d, req, ErrorCode::ShuttingDown);
        }
        assert_eq!(d.plan(&Request::Status, &catalog()), Ok(Change::Status));
        assert_eq!(d.plan(&Request::Shutdown, &catalog()), Ok(Change::Shutdown));
    }

    #[test]
    fn protocol_level_codes_come_from_parsing() {
        // malformed and unknown_command never reach plan: a Request is
        // always well formed. Checked here so every code has a unit test.
        assert_eq!(
            Request::parse(b"{").unwrap_err().code(),
            ErrorCode::Malformed
        );
        assert_eq!(
            Request::parse(br#"{"cmd":"explode"}"#).unwrap_err().code(),
            ErrorCode::UnknownCommand
        );
        assert_eq!(
            Reply::from(ControlError::Failed("spawn: ENOENT".into())).error_code(),
            Some("failed")
        );
    }

    #[test]
    fn pins_fill_the_device_exactly() {
        let mut s = two();
        run(
            &mut s,
            Request::Share {
                if_id: 1,
                pct: 40.0,
            },
        );
        assert_eq!(s.pinned_pct(), 100.0);
        // Re-pinning the same IF counts its old pin out.
        run(
            &mut s,
            Request::Share {
                if_id: 2,
                pct: 55.0,
            },
        );
        run(
            &mut s,
            Request::Share {
                if_id: 2,
                pct: 60.0,
            },
        );
        // Thirds written as decimals fit.
        let mut t = DesiredState::new("/x");
        for (id, m) in [(1, "squeezenet"), (2, "resnet50"), (3, "alexnet")] {
            run(&mut t, deploy(id, m));
            run(
                &mut t,
                Request::Share {
                    if_id: id,
                    pct: 33.333_333_4,
                },
            );
        }
    }

    #[test]
    fn changes_carry_old_and_new() {
        let s = two();
        let change = s
            .plan(
                &Request::Slo {
                    if_id: 2,
                    slo_ms: 150.0,
                },
                &catalog(),
            )
            .unwrap();
        let Change::Update { old, new } = &change else {
            panic!("{change:?}")
        };
        assert_eq!(old.slo_ms, 200.0);
        assert_eq!(new.slo_ms, 150.0);
        assert_eq!(old.share_pct, new.share_pct);
        let unpin = s.plan(&Request::Unpin { if_id: 2 }, &catalog()).unwrap();
        let Change::Update { new, .. } = &unpin else {
            panic!("{unpin:?}")
        };
        assert!(!new.pinned);
        assert_eq!(
            new.share_pct, 60.0,
            "unpin keeps the share until the allocator moves it"
        );
        let retire = s.plan(&Request::Retire { if_id: 1 }, &catalog()).unwrap();
        assert_eq!(retire.reply().to_json()["retired"]["model"], "squeezenet");
        let mut after = s.clone();
        after.apply(retire);
        assert!(after.get(1).is_none());
        assert!(after.get(2).is_some());
    }

    #[test]
    fn set_share_is_for_unpinned_ifs_only() {
        let mut s = two();
        assert!(s.set_share(1, 12.5));
        assert_eq!(s.get(1).unwrap().share_pct, 12.5);
        let before = s.clone();
        assert!(!s.set_share(2, 10.0), "pinned");
        assert!(!s.set_share(9, 10.0), "unknown");
        assert!(!s.set_share(1, 0.0), "invalid");
        assert!(!s.set_share(1, f64::NAN), "invalid");
        assert_eq!(s, before);
    }

    #[test]
    fn catalog_reads_knee_share_from_config() {
        let text = r#"
schema_version = 1
name = "resnet50"
if_id = 2
model_file = "model.onnx"
engine = "onnxruntime"
intra_op_threads = 1
top_k = 5
slo_ms = 200.0
[input]
name = "data"
format = "f32_nchw"
shape = [3, 224, 224]
[output]
name = "prob"
shape = [1000]
num_classes = 1000
kind = "probabilities"
[knee]
share_pct = 40
"#;
        let config = ModelConfig::parse(text, Path::new("/repo/resnet50/config.toml")).unwrap();
        let catalog = ModelCatalog::from_configs(std::slice::from_ref(&config));
        let e = catalog.get("resnet50").unwrap();
        assert_eq!(e.if_id, 2);
        assert!((e.slo_ms - 200.0).abs() < 1e-9);
        assert_eq!(e.knee_share_pct, Some(40.0));
        let no_knee = ModelConfig {
            knee: None,
            ..config
        };
        assert_eq!(CatalogEntry::from_config(&no_knee).knee_share_pct, None);
    }

    proptest::proptest! {
        /// Any sequence of commands: each is applied whole or not at all,
        /// and the pins never exceed the device.
        #[test]
        fn random_command_sequences_keep_the_invariants(
            ops in proptest::collection::vec((0u8..6, 0u16..5, -20.0f64..130.0), 0..40)
        ) {
            let cat = catalog();
            let mut s = DesiredState::new("/x");
            for (op, id, x) in ops {
                let req = match op {
                    0 => Request::Deploy {
                        if_id: id,
                        model: ["squeezenet", "resnet50", "alexnet", "squeezenet", "resnet50"][id as usize].into(),
                        binary: None, slo_ms: None, share_pct: None,
                    },
                    1 => Request::Retire { if_id: id },
                    2 => Request::Slo { if_id: id, slo_ms: x },
                    3 => Request::Share { if_id: id, pct: x },
                    4 => Request::Unpin { if_id: id },
                    _ => Request::Status,
                };
                let before = s.clone();
                match s.plan(&req, &cat) {
                    Ok(change) => s.apply(change),
                    Err(_) => proptest::prop_assert_eq!(&s, &before),
                }
                proptest::prop_assert!(s.pinned_pct() <= 100.0 + CAPACITY_SLACK_PCT);
                for d in s.ifs() {
                    proptest::prop_assert!(d.slo_ms > 0.0 && valid_pct(d.share_pct));
                    proptest::prop_assert_eq!(cat.get(&d.model).map(|e| e.if_id), Some(d.if_id));
                }
            }
        }
    }
}
