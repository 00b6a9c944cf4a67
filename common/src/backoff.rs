//! [`Backoff`]: the pauses between the attempts of one operation that waits for the
//! cluster to change (a coordinator leader elected, a crashed master's tablets
//! recovered, a backup with room again). Each pause is drawn at random from the upper
//! half of a step that doubles from a floor to a ceiling ("equal jitter"): callers that
//! failed at the same moment — every client of a coordinator leader that just died —
//! come back spread over the step instead of all at once, and none waits less than half
//! the step, so the pressure on the cluster still falls as the steps grow.
//!
//! The client's retries, the replicator's waits and the coordinator set's rounds all
//! pause with it.

use rand::Rng;
use std::time::Duration;

/// The pauses of one operation: see the module doc.
#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    max: Duration,
}

impl Backoff {
    /// Steps from `min` (at least 1 µs) doubling up to `max` (at least `min`).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        let min = min.max(Duration::from_micros(1));
        Backoff {
            step: min,
            max: max.max(min),
        }
    }

    /// The current step: the longest the next pause can be.
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The next pause, drawn from the thread's random numbers; the step then doubles,
    /// up to the ceiling.
    pub fn next_pause(&mut self) -> Duration {
        self.next_pause_with(&mut rand::thread_rng())
    }

    /// The next pause, drawn from `rng`: uniform in [step / 2, step].
    pub fn next_pause_with(&mut self, rng: &mut impl Rng) -> Duration {
        let step = self.step;
        let half = step / 2;
        let pause = half + step.saturating_sub(half).mul_f64(rng.gen::<f64>());
        self.step = (step * 2).min(self.max);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn pauses_lie_in_the_upper_half_of_a_step_that_doubles_to_the_ceiling() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));
        let mut steps = Vec::new();
        for _ in 0..12 {
            let step = backoff.step();
            let pause = backoff.next_pause_with(&mut rng);
            assert!(
                pause >= step / 2 && pause <= step,
                "{pause:?} outside [{step:?}/2, {step:?}]"
            );
            steps.push(step.as_millis());
        }
        assert_eq!(steps, [2, 4, 8, 16, 32, 64, 128, 200, 200, 200, 200, 200]);
    }

    #[test]
    fn callers_that_fail_together_come_back_spread_out() {
        let mut rng = SmallRng::seed_from_u64(11);
        let pauses: Vec<Duration> = (0..100)
            .map(|_| {
                Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
                    .next_pause_with(&mut rng)
            })
            .collect();
        let earliest = pauses.iter().min().copied().unwrap_or_default();
        let latest = pauses.iter().max().copied().unwrap_or_default();
        assert!(earliest >= Duration::from_millis(50));
        assert!(
            latest - earliest > Duration::from_millis(30),
            "100 callers' first pauses span only {:?}",
            latest - earliest
        );
    }

    #[test]
    fn a_zero_floor_or_a_ceiling_below_it_still_pauses() {
        let mut backoff = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert!(backoff.next_pause() <= Duration::from_micros(1));
        assert_eq!(backoff.step(), Duration::from_micros(1));
        let mut inverted = Backoff::new(Duration::from_millis(10), Duration::from_millis(1));
        assert_eq!(inverted.step(), Duration::from_millis(10));
        inverted.next_pause();
        assert_eq!(inverted.step(), Duration::from_millis(10));
    }
}
