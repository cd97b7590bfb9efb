//! tract (pure Rust, `tract-onnx`) as a [`Framework`]: the engine that needs
//! nothing installed.
//!
//! # Batches
//!
//! tract optimises a model for concrete shapes: the model repository's
//! models have a symbolic batch dimension (`N`), and a plan is made for one
//! value of it. So this engine parses and declutters the model once, with
//! `N` symbolic (`load_model`/`link_model`), and makes optimised, runnable
//! plans for concrete batch sizes from that: substitute `N`,
//! `into_optimized`, `into_runnable`.
//!
//! By default ([`TractBatching::Split`]) there is one plan, for batch 1,
//! built by `configure_batch`, and a batch of `n` runs as `n` runs of it.
//! Measured on the 2-core dev VM (release build, 1 thread, median; the
//! engines taking turns under the same load; `latency_onnxruntime_vs_tract`
//! in `kp-if/tests/engines.rs`):
//!
//! | model      | batch | tract, batch-8 plan | tract, 8 x batch-1 plan | ONNX Runtime |
//! |------------|------:|--------------------:|------------------------:|-------------:|
//! | squeezenet |     8 |              173 ms |                   89 ms |        33 ms |
//! | resnet50   |     8 |             1935 ms |                  664 ms |       323 ms |
//!
//! tract's batched plans cost 2-3x more per input than its batch-1 plan, so
//! splitting is faster, needs one copy of the packed weights instead of one
//! per batch size (RSS grew 96 MB per resnet50 plan), and never optimises
//! on the data path. The batching policy sees a cost linear in the batch.
//!
//! [`TractBatching::PerSize`] keeps tract's batched plans, for models where
//! they win: `configure_batch(max)` builds the plans for batch 1 and `max`,
//! any other size is built the first time a batch of it arrives (about
//! 0.05 s for squeezenet, 0.1-0.3 s for resnet50) and then cached;
//! [`Tract::prepare_all`] builds every size up front. One plan left
//! symbolic in `N` would serve every size with one copy of the weights, but
//! ran about 2x slower per batch on resnet50 (batch 1 and 8) than concrete
//! plans did, so neither strategy uses it.
//!
//! Each cached plan keeps its run state (tract's `SimpleState`), so a batch
//! reuses it rather than spawning one.
//!
//! # Limits
//!
//! - tract owns its input tensors: a batch is copied from the caller's slice
//!   into a tensor (ONNX Runtime reads it in place).
//! - tract runs a plan on the calling thread; `intra_op_threads` above 1 is
//!   accepted and not used (tract's multi-threaded matmul is an opt-in
//!   feature this build does not enable).
//! - Single-input, f32 models whose first input dimension is the batch and
//!   whose other dimensions are fixed, as in the model repository.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Cursor;
use std::path::Path;

use tract_onnx::prelude::{
    DatumType, Framework as _, InferenceModelExt, IntoRunnable, Symbol, TDim, Tensor, TypedModel,
    TypedSimpleState,
};
use tract_onnx::tract_hir::internal::tvec;

use libml::engine::{check_batch, EngineConfig, EngineError, Framework, ModelInfo};

/// One optimised plan for one batch size, with its run state.
struct Plan {
    state: TypedSimpleState,
    /// `[batch, C, H, W]`.
    input_shape: Vec<usize>,
}

/// The parsed, decluttered model with its batch dimension still symbolic.
struct Loaded {
    model: TypedModel,
    /// The batch symbol, or `None` if the model fixes its batch.
    batch: Option<Symbol>,
    /// The batch the model fixes, if it does.
    fixed_batch: Option<usize>,
    info: ModelInfo,
}

/// How [`Tract`] runs a batch of more than one input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TractBatching {
    /// As that many runs of the batch-1 plan, one input after the other:
    /// one plan, one copy of the packed weights, nothing optimised on the
    /// data path, and faster than tract's own batched plans (see the module
    /// docs).
    #[default]
    Split,
    /// With a plan made for that batch size: 1 and `max` from
    /// `configure_batch`, any other size on first use, then cached.
    PerSize,
}

/// tract behind the [`Framework`] callbacks.
#[derive(Default)]
pub struct Tract {
    batching: TractBatching,
    initialised: bool,
    loaded: Option<Loaded>,
    plans: BTreeMap<usize, Plan>,
    /// 0 until `configure_batch`.
    max_batch: usize,
}

impl fmt::Debug for Tract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tract")
            .field("batching", &self.batching)
            .field("initialised", &self.initialised)
            .field("model", &self.loaded.as_ref().map(|l| &l.info))
            .field("plans", &self.plans.keys().collect::<Vec<_>>())
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl Tract {
    /// An engine with no model that splits batches ([`TractBatching::Split`]).
    pub fn new() -> Self {
        Tract::default()
    }

    /// An engine with no model that runs batches as `batching` says.
    pub fn with_batching(batching: TractBatching) -> Self {
        Tract {
            batching,
            ..Tract::default()
        }
    }

    /// With [`TractBatching::PerSize`], builds the plans for every batch size
    /// in `1..=max_batch` now (after `configure_batch`), trading memory (one
    /// copy of the packed weights per size) for no optimisation on the data
    /// path at all. Nothing to do when splitting.
    pub fn prepare_all(&mut self) -> Result<(), EngineError> {
        if self.max_batch == 0 {
            return Err(EngineError::Order("prepare_all before configure_batch"));
        }
        if self.splits() {
            return Ok(());
        }
        for batch in 1..=self.max_batch {
            self.plan(batch)?;
        }
        Ok(())
    }

    /// Whether batches run as batch-1 runs: [`TractBatching::Split`], and a
    /// model whose batch dimension is not fixed.
    fn splits(&self) -> bool {
        self.batching == TractBatching::Split
            && self
                .loaded
                .as_ref()
                .is_some_and(|l| l.fixed_batch.is_none())
    }

    /// The batch sizes that have a plan.
    pub fn planned_batches(&self) -> Vec<usize> {
        self.plans.keys().copied().collect()
    }

    fn load(
        &mut self,
        read: impl FnOnce() -> tract_onnx::prelude::TractResult<tract_onnx::prelude::InferenceModel>,
        model: &str,
    ) -> Result<ModelInfo, EngineError> {
        if !self.initialised {
            return Err(EngineError::Order("a model is loaded before init"));
        }
        if self.loaded.is_some() {
            return Err(EngineError::Order(
                "a second model is loaded into one engine",
            ));
        }
        let bad = |reason: String| EngineError::Model {
            model: model.to_string(),
            reason,
        };
        let typed = read()
            .and_then(|m| m.into_typed())
            .and_then(|m| m.into_decluttered())
            .map_err(|e| bad(format!("{e:#}")))?;
        let loaded = describe(typed).map_err(bad)?;
        let info = loaded.info.clone();
        self.loaded = Some(loaded);
        Ok(info)
    }

    /// The plan for `batch`, built and cached if needed.
    fn plan(&mut self, batch: usize) -> Result<&mut Plan, EngineError> {
        let loaded = self
            .loaded
            .as_ref()
            .ok_or(EngineError::Order("a batch before a model"))?;
        Ok(match self.plans.entry(batch) {
            Entry::Occupied(plan) => plan.into_mut(),
            Entry::Vacant(slot) => slot.insert(build_plan(loaded, batch)?),
        })
    }
}

/// Reads the model's single input and first output, and its batch symbol.
fn describe(model: TypedModel) -> Result<Loaded, String> {
    let inputs = model.input_outlets().map_err(|e| e.to_string())?;
    let [input] = inputs else {
        return Err(format!(
            "has {} inputs, kneepoint serves single-input models",
            inputs.len()
        ));
    };
    let input = *input;
    let output = *model
        .output_outlets()
        .map_err(|e| e.to_string())?
        .first()
        .ok_or("has no output")?;
    let name_of = |outlet| {
        model
            .outlet_label(outlet)
            .map(str::to_string)
            .unwrap_or_else(|| model.node(outlet.node).name.clone())
    };
    let input_fact = model.outlet_fact(input).map_err(|e| e.to_string())?;
    let output_fact = model.outlet_fact(output).map_err(|e| e.to_string())?;
    for (what, fact) in [("input", input_fact), ("output", output_fact)] {
        if fact.datum_type != DatumType::F32 {
            return Err(format!(
                "{what} is {:?}, kneepoint serves f32 tensors",
                fact.datum_type
            ));
        }
    }
    let input_dims: Vec<TDim> = input_fact.shape.iter().cloned().collect();
    let output_dims: Vec<TDim> = output_fact.shape.iter().cloned().collect();
    let (batch, fixed_batch) = match input_dims.first() {
        Some(TDim::Sym(symbol)) => (Some(symbol.clone()), None),
        Some(TDim::Val(b)) if *b > 0 => (None, usize::try_from(*b).ok()),
        _ => {
            return Err(format!(
                "input shape {input_dims:?}: the first dimension must be the batch"
            ))
        }
    };
    let per_item = |dims: &[TDim], what: &str| -> Result<Vec<usize>, String> {
        dims.iter()
            .skip(1)
            .map(|d| {
                d.to_i64()
                    .ok()
                    .and_then(|d| usize::try_from(d).ok())
                    .filter(|&d| d > 0)
            })
            .collect::<Option<Vec<usize>>>()
            .filter(|_| dims.len() > 1)
            .ok_or_else(|| {
                format!(
                    "{what} shape {dims:?}: needs a batch dimension first and fixed sizes after it"
                )
            })
    };
    let info = ModelInfo {
        input_name: name_of(input),
        input_shape: per_item(&input_dims, "input")?,
        output_name: name_of(output),
        output_shape: per_item(&output_dims, "output")?,
    };
    Ok(Loaded {
        model,
        batch,
        fixed_batch,
        info,
    })
}

/// Optimises `loaded.model` for a batch of `batch`.
fn build_plan(loaded: &Loaded, batch: usize) -> Result<Plan, EngineError> {
    let failed = |e: tract_onnx::prelude::TractError| EngineError::Model {
        model: loaded.info.input_name.clone(),
        reason: format!("cannot prepare a plan for batch {batch}: {e:#}"),
    };
    let model = match &loaded.batch {
        Some(symbol) => {
            let n =
                i64::try_from(batch).map_err(|_| EngineError::Shape(format!("batch {batch}")))?;
            loaded
                .model
                .set_symbols(&HashMap::from([(symbol.clone(), TDim::Val(n))]))
                .map_err(failed)?
        }
        None => loaded.model.clone(),
    };
    let runnable = model
        .into_optimized()
        .and_then(|m| m.into_runnable())
        .map_err(failed)?;
    let state = runnable.spawn().map_err(failed)?;
    let mut input_shape = Vec::with_capacity(loaded.info.input_shape.len() + 1);
    input_shape.push(batch);
    input_shape.extend_from_slice(&loaded.info.input_shape);
    Ok(Plan { state, input_shape })
}

/// Runs `batch` inputs through `plan`, whose input shape is for `batch`.
fn run_plan(
    plan: &mut Plan,
    input: &[f32],
    batch: usize,
    output: &mut [f32],
) -> Result<(), EngineError> {
    let tensor = Tensor::from_shape::<f32>(&plan.input_shape, input)
        .map_err(|e| EngineError::Run(format!("input tensor: {e:#}")))?;
    let outputs = plan
        .state
        .run(tvec![tensor.into()])
        .map_err(|e| EngineError::Run(format!("{e:#}")))?;
    let first = outputs
        .first()
        .ok_or_else(|| EngineError::Run("the model returned no output".into()))?;
    let view = first
        .try_as_plain_ram()
        .map_err(|e| EngineError::Run(format!("output: {e:#}")))?;
    let data = view
        .as_slice::<f32>()
        .map_err(|e| EngineError::Run(format!("output: {e:#}")))?;
    if data.len() != output.len() || view.shape().first() != Some(&batch) {
        return Err(EngineError::Shape(format!(
            "the model returned shape {:?} for a batch of {batch}; expected {} f32",
            view.shape(),
            output.len()
        )));
    }
    output.copy_from_slice(data);
    Ok(())
}

impl Framework for Tract {
    fn name(&self) -> &str {
        "tract"
    }

    fn runs_on_calling_thread(&self) -> bool {
        true // module doc: tract runs a plan on the calling thread
    }

    fn init(&mut self, config: &EngineConfig) -> Result<(), EngineError> {
        if self.initialised {
            return Err(EngineError::Order("init is called twice"));
        }
        if config.intra_op_threads == 0 {
            return Err(EngineError::Run(
                "intra_op_threads = 0: an engine needs at least one thread".into(),
            ));
        }
        self.initialised = true;
        Ok(())
    }

    fn load_model(&mut self, path: &Path) -> Result<ModelInfo, EngineError> {
        self.load(
            || tract_onnx::onnx().model_for_path(path),
            &path.display().to_string(),
        )
    }

    fn link_model(&mut self, model_bytes: &[u8]) -> Result<ModelInfo, EngineError> {
        let model = format!("<{} bytes in memory>", model_bytes.len());
        self.load(
            || tract_onnx::onnx().model_for_read(&mut Cursor::new(model_bytes)),
            &model,
        )
    }

    fn configure_batch(&mut self, max_batch: usize) -> Result<(), EngineError> {
        let loaded = self
            .loaded
            .as_ref()
            .ok_or(EngineError::Order("configure_batch before a model"))?;
        if max_batch == 0 {
            return Err(EngineError::Shape("max_batch = 0".into()));
        }
        if let Some(fixed) = loaded.fixed_batch {
            if max_batch != fixed {
                return Err(EngineError::Shape(format!(
                    "the model fixes its batch at {fixed}; max_batch must be {fixed}, not {max_batch}"
                )));
            }
        }
        let fixed_batch = loaded.fixed_batch;
        self.plans.retain(|&batch, _| batch <= max_batch);
        self.max_batch = max_batch;
        match fixed_batch {
            Some(fixed) => {
                self.plan(fixed)?;
            }
            None if self.splits() => {
                self.plan(1)?;
            }
            None => {
                self.plan(1)?;
                self.plan(max_batch)?;
            }
        }
        Ok(())
    }

    fn infer_batch(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), EngineError> {
        let loaded = self
            .loaded
            .as_ref()
            .ok_or(EngineError::Order("infer_batch before a model"))?;
        if self.max_batch == 0 {
            return Err(EngineError::Order("infer_batch before configure_batch"));
        }
        check_batch(&loaded.info, input, batch, output, self.max_batch)?;
        if let Some(fixed) = loaded.fixed_batch {
            if batch != fixed {
                return Err(EngineError::Shape(format!(
                    "the model runs batches of exactly {fixed}, not {batch}"
                )));
            }
        }
        if self.splits() {
            let (per_in, per_out) = (loaded.info.input_elems(), loaded.info.output_elems());
            let plan = self.plan(1)?;
            for (one_in, one_out) in input.chunks(per_in).zip(output.chunks_mut(per_out)) {
                run_plan(plan, one_in, 1, one_out)?;
            }
            Ok(())
        } else {
            run_plan(self.plan(batch)?, input, batch, output)
        }
    }

    fn deinit(&mut self) {
        self.plans.clear();
        self.loaded = None;
        self.max_batch = 0;
        self.initialised = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_enforced() {
        let mut engine = Tract::new();
        assert!(matches!(
            engine.load_model(Path::new("m.onnx")),
            Err(EngineError::Order(_))
        ));
        engine
            .init(&EngineConfig {
                intra_op_threads: 1,
            })
            .unwrap();
        assert!(matches!(
            engine.init(&EngineConfig {
                intra_op_threads: 1
            }),
            Err(EngineError::Order(_))
        ));
        assert!(matches!(
            engine.configure_batch(1),
            Err(EngineError::Order(_))
        ));
        assert!(matches!(
            engine.infer_batch(&[], 1, &mut []),
            Err(EngineError::Order(_))
        ));
        engine.deinit();
    }

    #[test]
    fn garbage_is_a_model_error() {
        let mut engine = Tract::new();
        engine
            .init(&EngineConfig {
                intra_op_threads: 1,
            })
            .unwrap();
        let err = engine
            .link_model(b"this is not an onnx protobuf")
            .unwrap_err();
        assert!(matches!(err, EngineError::Model { .. }), "{err}");
        let err = engine
            .load_model(Path::new("/nonexistent/model.onnx"))
            .unwrap_err();
        assert!(matches!(err, EngineError::Model { .. }), "{err}");
    }
}
