//! The buffers of a step, allocated once for a maximum batch size.

use super::*;

/// Every activation and temporary of a step, allocated once for a maximum batch size:
/// steps do not allocate. Per row block ([`BLOCK_ROWS`]) it holds that block's
/// activations and partial gradient; it also holds the outputs of the last step: logits,
/// the flat dense gradient (the blocks' sum) and the embedding gradient.
#[derive(Clone, Debug)]
pub struct Workspace {
    pub(super) capacity: usize,
    pub(super) n: usize,
    /// The tower of the last forward.
    pub(super) tower: Tower,
    pub(super) num_params: usize,
    pub(super) blocks: Vec<Block>,
    pub(super) logits: Vec<f32>,
    /// The logits of tasks `1..T` of a multi-task model, task after task (`capacity`
    /// each).
    pub(super) task_logits: Vec<f32>,
    pub(super) d_emb: Vec<f32>,
    pub(super) grads: Vec<f32>,
    /// What each attention unit's forward keeps for its backward, per row block.
    pub(super) attention: Vec<Vec<AttentionActs>>,
    /// Training steps taken with this workspace, and the stream that, with the count,
    /// seeds each step's dropout masks.
    pub(super) steps: u64,
    pub(super) dropout_stream: u64,
}

impl Workspace {
    /// Workspace for `model` and batches of at most `capacity` samples.
    pub fn new(model: &DenseDlrm, capacity: usize) -> Self {
        let blocks = (0..capacity.div_ceil(BLOCK_ROWS))
            .map(|i| Block::new(model, (capacity - i * BLOCK_ROWS).min(BLOCK_ROWS)))
            .collect();
        Self {
            capacity,
            n: 0,
            tower: Tower::Memory,
            num_params: model.num_params(),
            blocks,
            logits: vec![0.0; capacity],
            task_logits: vec![0.0; capacity * (model.tasks() - 1)],
            d_emb: vec![0.0; capacity * model.emb_width()],
            grads: vec![0.0; model.num_params()],
            attention: vec![
                vec![AttentionActs::default(); capacity.div_ceil(BLOCK_ROWS)];
                model.attention.len()
            ],
            steps: 0,
            dropout_stream: model.config.seed,
        }
    }

    /// Sets the stream of this workspace's dropout masks and restarts its step count:
    /// trainers that compute gradients side by side (workers of one job) give each a
    /// stream of its own so that their masks differ.
    pub fn set_dropout_stream(&mut self, stream: u64) {
        self.dropout_stream = stream;
        self.steps = 0;
    }

    /// Copies the blocks' logits of the last forward into one `[n]` vector.
    pub(super) fn gather_logits(&mut self, n: usize) {
        self.n = n;
        for (i, chunk) in self.logits[..n].chunks_mut(BLOCK_ROWS).enumerate() {
            let last = self.blocks[i].logits(self.tower);
            chunk.copy_from_slice(&last[..chunk.len()]);
        }
        let cap = self.capacity;
        for (t, out) in self.task_logits.chunks_exact_mut(cap.max(1)).enumerate() {
            for (i, chunk) in out[..n].chunks_mut(BLOCK_ROWS).enumerate() {
                let a = self.blocks[i].mmoe.as_ref().expect("a multi-task model");
                let last = a.towers[t].last().expect("nonempty");
                chunk.copy_from_slice(&last[..chunk.len()]);
            }
        }
    }

    /// `grads = sum of the first `used` blocks' gradients`, added in block order (so the
    /// result does not depend on the thread count), parallel over parameter chunks.
    pub(super) fn reduce_grads(&mut self, used: usize) {
        const CHUNK: usize = 16 * 1024;
        let blocks = &self.blocks[..used];
        self.grads
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, out)| {
                let range = c * CHUNK..c * CHUNK + out.len();
                match blocks.split_first() {
                    None => out.fill(0.0),
                    Some((first, rest)) => {
                        out.copy_from_slice(&first.grads[range.clone()]);
                        for b in rest {
                            for (o, g) in out.iter_mut().zip(&b.grads[range.clone()]) {
                                *o += g;
                            }
                        }
                    }
                }
            });
    }

    /// Concatenates one activation of every block used by the last forward.
    pub(super) fn concat(&self, pick: impl Fn(&Block) -> &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        let mut left = self.n;
        for b in &self.blocks {
            if left == 0 {
                break;
            }
            let rows = left.min(b.rows());
            let a = pick(b);
            out.extend_from_slice(&a[..rows * (a.len() / b.rows())]);
            left -= rows;
        }
        out
    }

    /// Maximum batch size.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Batch size of the last call.
    pub fn batch(&self) -> usize {
        self.n
    }

    /// Logits of the last forward (`[n]`; task 0's for a multi-task model).
    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.n]
    }

    /// Task `task`'s logits of the last forward (`[n]`); task 0's are [`Workspace::logits`].
    ///
    /// # Panics
    /// If the model has no such task.
    pub fn task_logits(&self, task: usize) -> &[f32] {
        if task == 0 {
            return self.logits();
        }
        let start = (task - 1) * self.capacity;
        &self.task_logits[start..start + self.n]
    }

    /// Flat dense gradient of the last `forward_backward` (params layout).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// Mutable flat dense gradient (e.g. to average across workers in place).
    pub fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }

    /// The whole embedding-gradient buffer (`[capacity, T, d]`), for a caller that
    /// drives [`DenseDlrm::attend_backward`] from a gradient of its own (a bench of the
    /// attention units alone).
    pub fn d_emb_mut(&mut self) -> &mut [f32] {
        &mut self.d_emb
    }

    /// Gradient w.r.t. the embedding input of the last `forward_backward` (`[n, T, d]`).
    pub fn d_emb(&self) -> &[f32] {
        let per = self.d_emb.len() / self.capacity.max(1);
        &self.d_emb[..self.n * per]
    }

    /// Output of bottom-MLP layer `i` for the last forward (`[n, width]`, copied out of
    /// the row blocks).
    pub fn bottom_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.bottom_acts[i])
    }

    /// Output of top-MLP layer `i` for the last forward (`[n, width]`, copied).
    pub fn top_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.top_acts[i])
    }

    /// Output of adapt-tower layer `i` (an MTRM's) for the last forward (`[n, width]`,
    /// copied).
    pub fn adapt_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.adapt_acts[i])
    }

    /// Interaction output of the last forward (`[n, width]`, copied).
    pub fn interaction_output(&self) -> Vec<f32> {
        self.concat(|b| &b.inter)
    }

    /// Output of layer `layer` of MMoE expert `expert` for the last forward (`[n, width]`,
    /// copied).
    pub fn expert_activation(&self, expert: usize, layer: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").experts[expert][layer])
    }

    /// Output of layer `layer` of task `task`'s tower (`task ≥ 1`; task 0's is the top
    /// MLP) for the last forward (`[n, width]`, copied).
    pub fn task_tower_activation(&self, task: usize, layer: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").towers[task - 1][layer])
    }

    /// Task `task`'s gate weights over the experts for the last forward (`[n, K]`,
    /// copied).
    pub fn gate_weights(&self, task: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").gates[task])
    }
}
