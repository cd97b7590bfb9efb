//! The body of the `orchestrator_request` fuzz target (`fuzz/`), here so
//! that `cargo test -p orchestrator` replays its committed seed corpus
//! (`fuzz/corpus/orchestrator_request/`) through exactly the code the
//! fuzzer runs.
//!
//! The input is a session of requests, one per line, as `kpctl` would send
//! them to one daemon. Each goes through [`Request::parse`]; what parses is
//! planned against the desired state of the session so far, with a small
//! model catalog ([`DesiredState::plan`]), and applied if accepted, as the
//! daemon does. Properties, any of which failing panics:
//!
//! - parsing: a request re-encodes ([`Request::to_bytes`]) to bytes that
//!   parse to itself; a refusal is `malformed` or `unknown_command`, and its
//!   reply round-trips through [`Reply::parse`] with its code and message;
//! - planning: a refusal's reply round-trips likewise, an acceptance's
//!   reply is an `ok` one;
//! - the state after every applied change is one the daemon can act on:
//!   every IF is a catalog model under its own `if_id`, with an absolute
//!   binary, a finite SLO above 0, a share in (0, 100], and the pinned
//!   shares sum to at most 100% (plus the documented rounding slack).

use super::protocol::{ErrorCode, Reply, Request};
use super::state::{CatalogEntry, DesiredState, ModelCatalog};

/// Pins may sum to this (100% plus `state.rs`'s rounding slack, plus
/// float summation-order noise).
const MAX_PINNED_PCT: f64 = 100.0 + 1e-6 + 1e-9;

fn catalog() -> ModelCatalog {
    [
        ("squeezenet", 1, 20.0, None),
        ("resnet50", 2, 200.0, Some(45.0)),
        ("alexnet", 3, 100.0, None),
    ]
    .into_iter()
    .map(|(name, if_id, slo_ms, knee_share_pct)| CatalogEntry {
        name: name.into(),
        if_id,
        slo_ms,
        knee_share_pct,
        engine: kp_schema::model::EngineKind::OnnxRuntime,
    })
    .collect()
}

/// Runs `data`, split into lines, as a session of control requests (see
/// the module doc).
pub fn orchestrator_request(data: &[u8]) {
    let models = catalog();
    let mut state = DesiredState::new("/opt/kp/kp-if");
    for line in data.split(|&b| b == b'\n') {
        let request = match Request::parse(line) {
            Ok(request) => request,
            Err(e) => {
                assert!(
                    matches!(e.code(), ErrorCode::Malformed | ErrorCode::UnknownCommand),
                    "{e:?}"
                );
                refusal_round_trips(Reply::from(e));
                continue;
            }
        };
        let again = Request::parse(&request.to_bytes());
        assert_eq!(again.as_ref(), Ok(&request), "round trip");

        match state.plan(&request, &models) {
            Ok(change) => {
                let reply = Reply::parse(&change.reply().to_bytes()).expect("a reply parses");
                assert!(matches!(reply, Reply::Ok(_)), "{reply:?}");
                state.apply(change);
            }
            Err(e) => {
                assert!(
                    !matches!(e.code(), ErrorCode::Malformed | ErrorCode::UnknownCommand),
                    "a parsed request refused as unparsable: {e:?}"
                );
                refusal_round_trips(Reply::from(e));
            }
        }
        check(&state, &models);
    }
}

fn refusal_round_trips(reply: Reply) {
    let Reply::Error { code, message } = &reply else {
        panic!("a refusal is an error reply: {reply:?}");
    };
    assert!(!message.is_empty());
    let parsed = Reply::parse(&reply.to_bytes()).expect("an error reply parses");
    assert_eq!(
        parsed,
        Reply::Error {
            code: code.clone(),
            message: message.clone()
        }
    );
}

fn check(state: &DesiredState, models: &ModelCatalog) {
    for d in state.ifs() {
        let entry = models.get(&d.model).expect("a catalog model");
        assert_eq!(entry.if_id, d.if_id);
        assert!(d.binary.is_absolute(), "{d:?}");
        assert!(d.slo_ms.is_finite() && d.slo_ms > 0.0, "{d:?}");
        assert!(d.share_pct > 0.0 && d.share_pct <= 100.0, "{d:?}");
    }
    let pinned = state.pinned_pct();
    assert!(
        pinned <= MAX_PINNED_PCT,
        "pinned shares sum to {pinned}: {state:?}"
    );
}

#[cfg(test)]
mod tests {

    use super::*;

    /// The committed seeds run clean; each `valid_*` seed's first line is a
    /// request that parses, the others' do not.
    #[test]
    fn the_orchestrator_request_seed_corpus_runs_clean() {
        let files = kp_wire::fuzzing::seed_corpus("orchestrator_request");
        assert!(files.len() >= 10, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("orchestrator_request seed {name}");
            orchestrator_request(&bytes);
            let first = bytes.split(|&b| b == b'\n').next().unwrap();
            assert_eq!(
                Request::parse(first).is_ok(),
                name.starts_with("valid_"),
                "{name}"
            );
        }
    }

    /// A state that breaks the pinned-share rule is caught by `check`:
    /// the body is not a test that cannot fail.
    #[test]
    #[should_panic(expected = "pinned shares sum to 120")]
    fn an_over_pinned_state_is_caught() {
        let models = catalog();
        let mut s = DesiredState::new("/x");
        for (if_id, model) in [(1, "squeezenet"), (2, "resnet50")] {
            let deploy = Request::Deploy {
                if_id,
                model: model.into(),
                binary: None,
                slo_ms: None,
                share_pct: None,
            };
            s.apply(s.plan(&deploy, &models).unwrap());
        }
        let before = s.clone();
        s.apply(
            s.plan(
                &Request::Share {
                    if_id: 1,
                    pct: 60.0,
                },
                &models,
            )
            .unwrap(),
        );
        check(&s, &models);
        // Planned against the state before the first pin, applied after it.
        let stale = before.plan(
            &Request::Share {
                if_id: 2,
                pct: 60.0,
            },
            &models,
        );
        s.apply(stale.unwrap());
        check(&s, &models);
    }
}
