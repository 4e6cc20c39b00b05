//! The schedulers elastrec is compared with, as DLRover-RM §6 describes them. These are
//! the only policies written in the simulator: they are not elastrec's.
//!
//! - **ES** (elastic scheduling, Wu et al. [43]): changes workers only, a fixed step at a
//!   time; it grows while the last step raised throughput by at least half of proportional,
//!   then takes the last step back and stays.
//! - **Optimus** (Peng et al., EuroSys '18): fits its own speed model of asynchronous PS
//!   training, `f(w, p) = w / (θ0 + θ1·w/p + θ2·w + θ3·p)` (NNLS), and each interval adds
//!   the one worker or one PS with the larger predicted gain per core, while a gain
//!   remains. It has no term for embedding lookups (DLRover-RM's Eq. 5).

use elastrec_brain::nnls::{nnls, Matrix};

/// ES's state.
#[derive(Debug, Clone, Default)]
pub struct Es {
    /// Workers added by the last step and the throughput before it.
    last: Option<(u32, f64)>,
    /// No more steps.
    pub frozen: bool,
}

/// Workers ES adds or removes per step.
pub const ES_STEP: u32 = 2;

impl Es {
    /// The next worker count from the throughput `tp` measured at `workers` (`None`: keep).
    pub fn decide(&mut self, workers: u32, tp: f64, max_workers: u32) -> Option<u32> {
        if self.frozen {
            return None;
        }
        let next = match self.last {
            Some((added, before)) => {
                let w0 = f64::from(workers - added);
                let wanted = before * (1.0 + 0.5 * f64::from(added) / w0);
                if tp >= wanted && workers < max_workers {
                    Some((workers + ES_STEP).min(max_workers))
                } else {
                    self.frozen = true;
                    return (tp < wanted).then_some(workers - added);
                }
            }
            None => (workers < max_workers).then(|| (workers + ES_STEP).min(max_workers)),
        };
        match next {
            Some(n) => self.last = Some((n - workers, tp)),
            None => self.frozen = true,
        }
        next
    }
}

/// Optimus's state: its profile `(w, p, seconds per iteration)`.
#[derive(Debug, Clone, Default)]
pub struct Optimus {
    samples: Vec<(u32, u32, f64)>,
    probes: u32,
}

fn features(w: f64, p: f64) -> [f64; 4] {
    [1.0, w / p, w, p]
}

impl Optimus {
    /// Records one measured window.
    pub fn observe(&mut self, w: u32, p: u32, iter_time_s: f64) {
        if iter_time_s.is_finite() && iter_time_s > 0.0 {
            self.samples.push((w, p, iter_time_s));
        }
    }

    fn fit(&self) -> Option<[f64; 4]> {
        let rows: Vec<Vec<f64>> = self
            .samples
            .iter()
            .map(|&(w, p, _)| features(f64::from(w), f64::from(p)).to_vec())
            .collect();
        let b: Vec<f64> = self.samples.iter().map(|s| s.2).collect();
        let a = Matrix::from_rows(&rows).ok()?;
        let x = nnls(&a, &b).ok()?.x;
        Some([x[0], x[1], x[2], x[3]])
    }

    /// The next (workers, PS): one node more where its model predicts the larger gain per
    /// core, probing one worker and one PS first so the fit has three allocations.
    pub fn decide(
        &mut self,
        w: u32,
        p: u32,
        worker_cpu: f64,
        ps_cpu: f64,
        max: (u32, u32),
    ) -> Option<(u32, u32)> {
        if self.probes < 2 {
            self.probes += 1;
            return if self.probes == 1 && w < max.0 {
                Some((w + 1, p))
            } else if p < max.1 {
                Some((w, p + 1))
            } else {
                None
            };
        }
        let th = self.fit()?;
        let speed = |w: u32, p: u32| {
            let f = features(f64::from(w), f64::from(p));
            let t: f64 = f.iter().zip(&th).map(|(a, b)| a * b).sum();
            if t > 0.0 {
                f64::from(w) / t
            } else {
                0.0
            }
        };
        let now = speed(w, p);
        let gain_w = (w < max.0).then(|| (speed(w + 1, p) - now) / worker_cpu);
        let gain_p = (p < max.1).then(|| (speed(w, p + 1) - now) / ps_cpu);
        // A step must be worth at least 1% of the current speed.
        let min = 0.01 * now;
        match (gain_w, gain_p) {
            (Some(gw), Some(gp)) if gw >= gp && gw * worker_cpu > min => Some((w + 1, p)),
            (_, Some(gp)) if gp * ps_cpu > min => Some((w, p + 1)),
            (Some(gw), _) if gw * worker_cpu > min => Some((w + 1, p)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es_grows_while_it_pays_then_takes_the_last_step_back() {
        let mut es = Es::default();
        assert_eq!(es.decide(4, 100.0, 64), Some(6));
        // 4 -> 6 workers gave 1.4x: more than half of proportional (1.25x): go on.
        assert_eq!(es.decide(6, 140.0, 64), Some(8));
        // 6 -> 8 gave 1.05x, less than 1 + 0.5 * 2/6: back to 6, and stay.
        assert_eq!(es.decide(8, 147.0, 64), Some(6));
        assert_eq!(es.decide(6, 140.0, 64), None);
        assert!(es.frozen);
    }

    #[test]
    fn optimus_probes_then_adds_the_node_its_model_prefers() {
        let mut o = Optimus::default();
        assert_eq!(o.decide(4, 1, 4.0, 4.0, (64, 32)), Some((5, 1)));
        assert_eq!(o.decide(5, 1, 4.0, 4.0, (64, 32)), Some((5, 2)));
        // A job bound by its one PS: time = 0.1 + 0.05 w/p.
        for (w, p) in [(4, 1), (5, 1), (5, 2), (8, 2), (8, 4)] {
            let t = 0.1 + 0.05 * f64::from(w) / f64::from(p);
            o.observe(w, p, t);
        }
        assert_eq!(o.decide(5, 1, 4.0, 4.0, (64, 32)), Some((5, 2)));
    }
}
