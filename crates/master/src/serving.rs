//! Serving buffers of a mixture job (Primus §5.2, Algorithm 2): the task queue keeps one
//! buffer per source (the history's files, the stream's partitions), and each request for
//! work is served from the buffer the policy picks. Pure: no clock, no I/O.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The buffer of the history (batch files).
pub const HISTORY: usize = 0;
/// The buffer of the stream (Kafka partitions).
pub const STREAM: usize = 1;

/// How the buffers are served.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Serving {
    /// Source order: every queued history task before any stream task ("first the
    /// history, then the stream"). Also what a job with one source does.
    Sequential,
    /// Rows of each source in proportion to its weight while both have tasks (stride
    /// scheduling over rows handed out); a source with nothing queued yields to the other.
    Weighted {
        /// `[history, stream]` weights, positive.
        weights: [f64; 2],
    },
    /// Primus Eq. 4: the buffer with the highest `w_i · sigmoid(q_i − target)`, where
    /// `q_i` is its queued tasks. Far above `target` a buffer's priority is its weight;
    /// near it the backlog decides, so a heavier source still waits for a little data
    /// instead of taking every single task the moment it arrives.
    Priority {
        /// `[history, stream]` weights, positive.
        weights: [f64; 2],
        /// Queued tasks at which a buffer has half its weight.
        target: f64,
    },
}

impl std::fmt::Display for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Serving::Sequential => write!(f, "sequential"),
            Serving::Weighted { weights: [h, s] } => {
                write!(f, "weighted, history {h} : stream {s}")
            }
            Serving::Priority {
                weights: [h, s],
                target,
            } => write!(
                f,
                "priority, history {h} : stream {s}, target {target} tasks"
            ),
        }
    }
}

/// Rows and tasks handed out per source, for status and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// Tasks handed out.
    pub tasks: u64,
    /// Rows of those tasks.
    pub rows: u64,
}

/// The two buffers of task ids, and how they are served.
#[derive(Debug, Clone)]
pub struct Buffers {
    queues: [VecDeque<u64>; 2],
    serving: Serving,
    /// Weighted serving: rows handed out divided by the weight, per buffer.
    pass: [f64; 2],
    /// Weighted serving: the pass of the buffer served last; a buffer that was empty
    /// starts again from here, so idle time is not banked as credit.
    vtime: f64,
    served: [Served; 2],
}

impl Default for Buffers {
    fn default() -> Self {
        Self {
            queues: [VecDeque::new(), VecDeque::new()],
            serving: Serving::Sequential,
            pass: [0.0; 2],
            vtime: 0.0,
            served: [Served::default(); 2],
        }
    }
}

impl Buffers {
    /// Sets the policy (kept across restores: it is the job's configuration, not state).
    pub fn set_serving(&mut self, serving: Serving) {
        self.serving = serving;
    }

    /// The policy in force.
    pub fn serving(&self) -> Serving {
        self.serving
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

    /// Queued tasks in both buffers.
    pub fn len(&self) -> usize {
        self.queues[HISTORY].len() + self.queues[STREAM].len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tasks and rows handed out per buffer (`[history, stream]`).
    pub fn served(&self) -> [Served; 2] {
        self.served
    }

    /// Records that a task of `rows` rows left buffer `b` for a worker.
    pub fn record_served(&mut self, b: usize, rows: u64) {
        self.served[b].tasks += 1;
        self.served[b].rows += rows;
        if let Serving::Weighted { weights } = self.serving {
            self.vtime = self.pass[b];
            self.pass[b] += rows as f64 / weights[b];
        }
    }

    /// The buffer the next task comes from (Algorithm 2's arg max), `None` when both are
    /// empty.
    pub fn pick(&mut self) -> Option<usize> {
        let queued = [self.queues[HISTORY].len(), self.queues[STREAM].len()];
        let candidates = (0..2).filter(|&b| queued[b] > 0);
        match self.serving {
            Serving::Sequential => candidates.min(),
            Serving::Weighted { .. } => {
                for b in (0..2).filter(|&b| queued[b] > 0) {
                    self.pass[b] = self.pass[b].max(self.vtime);
                }
                // Ties go to the stream: fresher data first.
                candidates.min_by(|&a, &b| self.pass[a].total_cmp(&self.pass[b]).then(b.cmp(&a)))
            }
            Serving::Priority { weights, target } => candidates.max_by(|&a, &b| {
                let p = |i: usize| weights[i] * sigmoid(queued[i] as f64 - target);
                p(a).total_cmp(&p(b)).then(a.cmp(&b))
            }),
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

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
                weights: [1.0, 3.0],
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
            weights: [1.0, 2.0],
            target: 2.0,
        };
        assert_eq!(filled(serving, 50, 1).pick(), Some(HISTORY));
        assert_eq!(filled(serving, 50, 3).pick(), Some(STREAM));
        // A backlog of 3 stream tasks is served until one is left, then history.
        let mut b = filled(serving, 50, 3);
        assert_eq!(serve(&mut b, 4, 10), vec![1, 1, 0, 0]);
        // A heavy stream weight preempts the history as soon as anything arrives.
        let heavy = Serving::Priority {
            weights: [1.0, 10.0],
            target: 2.0,
        };
        assert_eq!(filled(heavy, 50, 1).pick(), Some(STREAM));
        // An empty buffer is never picked, whatever its weight.
        assert_eq!(filled(heavy, 5, 0).pick(), Some(HISTORY));
        assert_eq!(filled(heavy, 0, 0).pick(), None);
    }
}
