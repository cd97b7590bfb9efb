//! Arena offsets for a plan's tensors: first fit over lifetimes.
//!
//! Each buffer (a step's output, or the input) lives from the step that
//! writes it to the last step that reads it (the output to the end). At each
//! step, buffers whose last reader ran before it are freed, then the step's
//! output takes the lowest free gap that fits. A buffer read by step `i` is
//! still live while step `i` writes, so no step's output overlaps its
//! inputs. Offsets and sizes are per sample and rounded up to 64 f32
//! (256 bytes, the alignment cuDNN and cuBLAS prefer); at batch `b` every
//! offset and size is multiplied by `b`, which keeps disjoint buffers
//! disjoint, so one layout serves every batch size.

use crate::plan::{Buffer, Step};

/// Alignment of offsets and sizes, in f32.
pub const ALIGN: usize = 64;

/// The arena layout: one buffer per root, at the root's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Buffers, indexed by root.
    pub buffers: Vec<Buffer>,
    /// Arena f32 per sample.
    pub arena_per_sample: usize,
}

/// Lays out the roots of `steps` (whose tensors still name roots):
/// `root_elems[r]` values per sample, `writer[r]` the step writing root `r`
/// (`None` for the input), `output_root` live to the end.
pub fn assign(
    steps: &[Step],
    root_elems: &[usize],
    writer: &[Option<usize>],
    output_root: usize,
) -> Layout {
    let roots = root_elems.len();
    let mut last_read: Vec<Option<usize>> = vec![None; roots];
    for (i, s) in steps.iter().enumerate() {
        for t in &s.inputs {
            last_read[t.buffer] = Some(i);
        }
    }
    last_read[output_root] = Some(steps.len());
    let size = |r: usize| root_elems[r].div_ceil(ALIGN) * ALIGN;

    let mut buffers = vec![
        Buffer {
            offset: 0,
            elems: 0
        };
        roots
    ];
    // Live (offset, size, root), sorted by offset.
    let mut live: Vec<(usize, usize, usize)> = Vec::new();
    let mut arena = 0;
    let mut place = |r: usize, live: &mut Vec<(usize, usize, usize)>, arena: &mut usize| {
        let want = size(r);
        let mut at = 0;
        let mut slot = live.len();
        for (i, &(off, len, _)) in live.iter().enumerate() {
            if off >= at + want {
                slot = i;
                break;
            }
            at = at.max(off + len);
        }
        live.insert(slot, (at, want, r));
        *arena = (*arena).max(at + want);
        buffers[r] = Buffer {
            offset: at,
            elems: root_elems[r],
        };
    };
    // Roots not written by any step (the input) first.
    for (r, w) in writer.iter().enumerate() {
        if w.is_none() {
            place(r, &mut live, &mut arena);
        }
    }
    for (i, s) in steps.iter().enumerate() {
        live.retain(|&(_, _, r)| last_read[r].is_some_and(|l| l >= i));
        place(s.output.buffer, &mut live, &mut arena);
    }
    Layout {
        buffers,
        arena_per_sample: arena,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Activation, Op, Tensor};

    fn step(inputs: &[usize], output: usize) -> Step {
        Step {
            op: Op::Activation(Activation::Relu),
            inputs: inputs
                .iter()
                .map(|&b| Tensor {
                    buffer: b,
                    shape: vec![100],
                })
                .collect(),
            output: Tensor {
                buffer: output,
                shape: vec![100],
            },
            nodes: vec![],
        }
    }

    #[test]
    fn a_chain_reuses_two_buffers_and_outputs_never_overlap_inputs() {
        // 0 -> 1 -> 2 -> 3 -> 4: ping-pong between two slots.
        let steps: Vec<Step> = (0..4).map(|i| step(&[i], i + 1)).collect();
        let writer = vec![None, Some(0), Some(1), Some(2), Some(3)];
        let l = assign(&steps, &[100; 5], &writer, 4);
        assert_eq!(l.arena_per_sample, 256);
        for s in &steps {
            let o = l.buffers[s.output.buffer];
            for t in &s.inputs {
                let i = l.buffers[t.buffer];
                assert!(o.offset + o.elems <= i.offset || i.offset + i.elems <= o.offset);
            }
        }
    }

    #[test]
    fn a_value_read_late_stays_live() {
        // 0 -> 1 -> 2, and step 2 sums 1 and 0 into 3: 0 lives to step 2.
        let steps = vec![step(&[0], 1), step(&[1], 2), step(&[2, 0], 3)];
        let writer = vec![None, Some(0), Some(1), Some(2)];
        let l = assign(&steps, &[100; 4], &writer, 3);
        let b = &l.buffers;
        let disjoint =
            |x: Buffer, y: Buffer| x.offset + x.elems <= y.offset || y.offset + y.elems <= x.offset;
        assert!(disjoint(b[0], b[2]) && disjoint(b[0], b[3]) && disjoint(b[2], b[3]));
        assert!(disjoint(b[0], b[1]));
    }
}
