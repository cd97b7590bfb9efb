//! The k highest scores of one model output, highest first.
//!
//! docs/PROTOCOL.md answers a request with its IF's top-k `(class, score)` pairs,
//! highest score first, `score` being the model's raw output (no softmax).
//! [`top_k`] writes them into a caller buffer (no allocation on the data
//! path). Ties go to the lower class index, so answers are deterministic;
//! NaN scores rank below every number.

/// Writes the `k` highest `(class, score)` pairs of `scores` into
/// `out[..k']`, highest first, and returns `k' = min(k, scores.len(),
/// out.len())`.
pub fn top_k(scores: &[f32], k: usize, out: &mut [(u32, f32)]) -> usize {
    let k = k.min(scores.len()).min(out.len());
    if k == 0 {
        return 0;
    }
    let mut n = 0; // entries in out[..n], sorted best first
    for (class, &score) in scores.iter().enumerate() {
        if n == k && !better(score, class, out[k - 1]) {
            continue;
        }
        // Insertion point: after every entry at least as good.
        let mut i = n.min(k - 1);
        while i > 0 && better(score, class, out[i - 1]) {
            out[i] = out[i - 1];
            i -= 1;
        }
        out[i] = (class as u32, score);
        n = (n + 1).min(k);
    }
    k
}

/// True if `(class, score)` ranks above `other`.
fn better(score: f32, class: usize, other: (u32, f32)) -> bool {
    match (score.is_nan(), other.1.is_nan()) {
        (true, _) => false,
        (false, true) => true,
        _ => score > other.1 || (score == other.1 && (class as u32) < other.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Obviously correct: sort everything.
    fn reference(scores: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = scores
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, *s))
            .collect();
        all.sort_by(|a, b| {
            let key = |x: &(u32, f32)| if x.1.is_nan() { f32::NEG_INFINITY } else { x.1 };
            key(b)
                .partial_cmp(&key(a))
                .unwrap()
                .then(a.1.is_nan().cmp(&b.1.is_nan()))
                .then(a.0.cmp(&b.0))
        });
        all.truncate(k);
        all
    }

    #[test]
    fn highest_first_ties_to_the_lower_class() {
        let mut out = [(0, 0.0); 5];
        let n = top_k(&[0.1, 0.9, 0.5, 0.9, -1.0], 3, &mut out);
        assert_eq!(&out[..n], &[(1, 0.9), (3, 0.9), (2, 0.5)]);
        assert_eq!(
            top_k(&[1.0, 2.0], 5, &mut out),
            2,
            "k is capped by the output size"
        );
        assert_eq!(&out[..2], &[(1, 2.0), (0, 1.0)]);
        assert_eq!(top_k(&[], 5, &mut out), 0);
    }

    proptest! {
        #[test]
        fn matches_a_full_sort(
            scores in proptest::collection::vec(prop_oneof![-4i8..4i8].prop_map(|x| f32::from(x) / 2.0), 0..60),
            k in 0usize..8,
        ) {
            let mut out = [(0u32, 0f32); 8];
            let n = top_k(&scores, k, &mut out);
            let want = reference(&scores, k);
            prop_assert_eq!(&out[..n], &want[..]);
        }
    }
}
