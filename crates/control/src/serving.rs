//! Serving buffers (Primus §5.2, Algorithm 2): a job's queue keeps one buffer of data tasks
//! per source (each `[[data.source]]`, or the history's files, then the stream's
//! partitions), and each request for work is served from the buffer the policy picks.
//! Pure: no clock, no I/O. The master serves its task queue through it, and `elastrec
//! train` its interleaved reads, so both mix sources the same way.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The first history buffer (the only one of a job without `[[data.source]]`).
pub const HISTORY: usize = 0;

/// How the buffers are served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Serving {
    /// Buffer order: every queued task of a buffer before any of the next ("first the
    /// history, then the stream"). Also what a job with one source does.
    Sequential,
    /// Rows of each buffer in proportion to its weight while it has tasks (stride
    /// scheduling over rows handed out); a buffer with nothing queued yields to the
    /// others and banks no credit for the time it was empty.
    Weighted {
        /// One positive weight per buffer.
        weights: Vec<f64>,
    },
    /// Primus Eq. 4: the buffer with the highest `w_i · sigmoid(q_i − target)`, where
    /// `q_i` is its queued tasks. Far above `target` a buffer's priority is its weight;
    /// near it the backlog decides, so a heavier source still waits for a little data
    /// instead of taking every single task the moment it arrives.
    Priority {
        /// One positive weight per buffer.
        weights: Vec<f64>,
        /// Queued tasks at which a buffer has half its weight.
        target: f64,
    },
}

impl Serving {
    /// Buffer `b`'s weight (1 for a buffer the weights do not name).
    fn weight(&self, b: usize) -> f64 {
        match self {
            Serving::Sequential => 1.0,
            Serving::Weighted { weights } | Serving::Priority { weights, .. } => {
                weights.get(b).copied().unwrap_or(1.0)
            }
        }
    }
}

impl std::fmt::Display for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ratio = |w: &[f64]| {
            w.iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(" : ")
        };
        match self {
            Serving::Sequential => write!(f, "sequential"),
            Serving::Weighted { weights } => write!(f, "weighted {}", ratio(weights)),
            Serving::Priority { weights, target } => {
                write!(f, "priority {}, target {target} tasks", ratio(weights))
            }
        }
    }
}

/// Rows and tasks handed out per buffer, for status and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// Tasks handed out.
    pub tasks: u64,
    /// Rows of those tasks.
    pub rows: u64,
}

/// The buffers of task ids, and how they are served.
#[derive(Debug, Clone)]
pub struct Buffers {
    queues: Vec<VecDeque<u64>>,
    serving: Serving,
    /// Weighted serving: rows handed out divided by the weight, per buffer.
    pass: Vec<f64>,
    /// Weighted serving: the pass of the buffer served last; a buffer that was empty
    /// starts again from here, so idle time is not banked as credit.
    vtime: f64,
    served: Vec<Served>,
}

impl Default for Buffers {
    fn default() -> Self {
        Self::new(2)
    }
}

impl Buffers {
    /// `count` empty buffers, served sequentially until [`Buffers::set_serving`].
    pub fn new(count: usize) -> Self {
        let count = count.max(1);
        Self {
            queues: vec![VecDeque::new(); count],
            serving: Serving::Sequential,
            pass: vec![0.0; count],
            vtime: 0.0,
            served: vec![Served::default(); count],
        }
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.queues.len()
    }

    /// Sets the policy (kept across restores: it is the job's configuration, not state).
    pub fn set_serving(&mut self, serving: Serving) {
        self.serving = serving;
    }

    /// The policy in force.
    pub fn serving(&self) -> &Serving {
        &self.serving
    }

    /// Buffer `b`'s task ids, in serving order.
    pub fn queue(&self, b: usize) -> &VecDeque<u64> {
        &self.queues[b]
    }

    /// Appends a task to buffer `b`.
    pub fn push_back(&mut self, b: usize, id: u64) {
        self.queues[b].push_back(id);
    }

    /// Puts a task at the head of buffer `b` (a lost worker's remainder).
    pub fn push_front(&mut self, b: usize, id: u64) {
        self.queues[b].push_front(id);
    }

    /// Takes the task at place `i` of buffer `b`.
    pub fn remove(&mut self, b: usize, i: usize) -> Option<u64> {
        self.queues[b].remove(i)
    }

    /// Takes every queued task out, buffer by buffer in serving order (to deal them
    /// again into a new set of buffers).
    pub fn drain(&mut self) -> Vec<(usize, u64)> {
        let mut out = Vec::with_capacity(self.len());
        for (b, q) in self.queues.iter_mut().enumerate() {
            out.extend(q.drain(..).map(|id| (b, id)));
        }
        out
    }

    /// Queued tasks in every buffer.
    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tasks and rows handed out per buffer.
    pub fn served(&self) -> &[Served] {
        &self.served
    }

    /// Records that a task of `rows` rows left buffer `b` for a worker.
    pub fn record_served(&mut self, b: usize, rows: u64) {
        self.served[b].tasks += 1;
        self.served[b].rows += rows;
        if let Serving::Weighted { .. } = self.serving {
            self.vtime = self.pass[b];
            self.pass[b] += rows as f64 / self.serving.weight(b);
        }
    }

    /// The buffer the next task comes from (Algorithm 2's arg max), `None` when every
    /// buffer is empty.
    pub fn pick(&mut self) -> Option<usize> {
        let queued: Vec<usize> = self.queues.iter().map(VecDeque::len).collect();
        let candidates = (0..queued.len()).filter(|&b| queued[b] > 0);
        match &self.serving {
            Serving::Sequential => candidates.min(),
            Serving::Weighted { .. } => {
                for b in (0..queued.len()).filter(|&b| queued[b] > 0) {
                    self.pass[b] = self.pass[b].max(self.vtime);
                }
                // Ties go to the later buffer: the stream, or the newer source, first.
                candidates.min_by(|&a, &b| self.pass[a].total_cmp(&self.pass[b]).then(b.cmp(&a)))
            }
            Serving::Priority { target, .. } => {
                let p = |i: usize| self.serving.weight(i) * sigmoid(queued[i] as f64 - target);
                candidates.max_by(|&a, &b| p(a).total_cmp(&p(b)).then(a.cmp(&b)))
            }
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: usize = 1;

    fn filled(serving: Serving, history: u64, stream: u64) -> Buffers {
        let mut b = Buffers::default();
        b.set_serving(serving);
        for id in 0..history {
            b.push_back(HISTORY, id);
        }
        for id in 0..stream {
            b.push_back(STREAM, 1000 + id);
        }
        b
    }

    /// Serves `n` tasks of `rows` rows each; returns the buffers they came from.
    fn serve(b: &mut Buffers, n: usize, rows: u64) -> Vec<usize> {
        (0..n)
            .map_while(|_| {
                let at = b.pick()?;
                b.remove(at, 0);
                b.record_served(at, rows);
                Some(at)
            })
            .collect()
    }

    #[test]
    fn sequential_serves_the_whole_history_first() {
        let mut b = filled(Serving::Sequential, 3, 2);
        assert_eq!(serve(&mut b, 10, 100), vec![0, 0, 0, 1, 1]);
        assert_eq!(b.pick(), None);
        assert_eq!(
            b.served()[HISTORY],
            Served {
                tasks: 3,
                rows: 300
            }
        );
    }

    #[test]
    fn weighted_serving_hands_out_rows_in_proportion_and_banks_no_idle_credit() {
        let mut b = filled(
            Serving::Weighted {
                weights: vec![1.0, 3.0],
            },
            100,
            100,
        );
        let order = serve(&mut b, 40, 100);
        let stream = order.iter().filter(|&&s| s == STREAM).count();
        assert_eq!(stream, 30, "3 stream tasks per history task: {order:?}");
        // The stream runs dry for a while: history alone is served ...
        while b.queue(STREAM).front().is_some() {
            b.remove(STREAM, 0);
        }
        assert_eq!(serve(&mut b, 20, 100), vec![HISTORY; 20]);
        // ... and when the stream is back it gets its share, not the 20 tasks it missed.
        for id in 0..40 {
            b.push_back(STREAM, 5000 + id);
        }
        let order = serve(&mut b, 8, 100);
        let stream = order.iter().filter(|&&s| s == STREAM).count();
        assert_eq!(stream, 6, "{order:?}");
    }

    /// Eq. 4 by hand: with weights 1 (history, a long backlog: priority ≈ 1) and 2
    /// (stream), target 2, the stream's priority is 2·σ(q − 2): 0.54 at q = 1 (history
    /// wins), 1.0 at q = 2 (tie, to the stream) and 1.46 at q = 3.
    #[test]
    fn priority_follows_equation_4() {
        let serving = Serving::Priority {
            weights: vec![1.0, 2.0],
            target: 2.0,
        };
        assert_eq!(filled(serving.clone(), 50, 1).pick(), Some(HISTORY));
        assert_eq!(filled(serving.clone(), 50, 3).pick(), Some(STREAM));
        // A backlog of 3 stream tasks is served until one is left, then history.
        let mut b = filled(serving, 50, 3);
        assert_eq!(serve(&mut b, 4, 10), vec![1, 1, 0, 0]);
        // A heavy stream weight preempts the history as soon as anything arrives.
        let heavy = Serving::Priority {
            weights: vec![1.0, 10.0],
            target: 2.0,
        };
        assert_eq!(filled(heavy.clone(), 50, 1).pick(), Some(STREAM));
        // An empty buffer is never picked, whatever its weight.
        assert_eq!(filled(heavy.clone(), 5, 0).pick(), Some(HISTORY));
        assert_eq!(filled(heavy, 0, 0).pick(), None);
    }

    /// Three sources weighted 3 : 1 : 2: every window of 12 tasks of equal rows holds 6,
    /// 2 and 4 of them; when the heaviest runs dry the other two share in their ratio,
    /// and draining hands out every task once.
    #[test]
    fn weighted_serving_mixes_any_number_of_sources() {
        let mut b = Buffers::new(3);
        b.set_serving(Serving::Weighted {
            weights: vec![3.0, 1.0, 2.0],
        });
        for (buffer, n) in [(0, 30u64), (1, 40), (2, 40)] {
            for id in 0..n {
                b.push_back(buffer, buffer as u64 * 1000 + id);
            }
        }
        let order = serve(&mut b, 60, 50);
        for window in order.chunks(12) {
            let count = |s: usize| window.iter().filter(|&&b| b == s).count();
            assert_eq!([count(0), count(1), count(2)], [6, 2, 4], "{order:?}");
        }
        // Source 0 is out after 60 tasks; 1 and 2 go on 1 : 2.
        let order = serve(&mut b, 30, 50);
        let count = |s: usize| order.iter().filter(|&&b| b == s).count();
        assert_eq!([count(0), count(1), count(2)], [0, 10, 20], "{order:?}");
        let rest = serve(&mut b, 1000, 50);
        assert_eq!(rest.len(), 20);
        let rows: Vec<u64> = b.served().iter().map(|s| s.rows).collect();
        assert_eq!(rows, vec![30 * 50, 40 * 50, 40 * 50]);
        assert_eq!(b.pick(), None);
    }

    #[test]
    fn drain_hands_back_every_task_in_buffer_order() {
        let mut b = filled(Serving::Sequential, 2, 2);
        assert_eq!(b.drain(), vec![(0, 0), (0, 1), (1, 1000), (1, 1001)]);
        assert!(b.is_empty());
    }
}
