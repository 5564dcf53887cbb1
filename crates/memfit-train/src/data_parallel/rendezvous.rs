//! Where the ranks of a data-parallel group meet: each brings a value, the last to arrive combines
//! them in rank order, every rank leaves with the result. A rank that does not arrive within the
//! timeout, or that gives up ([`Rendezvous::abort`]), fails the meeting for all: nobody waits
//! forever.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a collective between ranks failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    #[error(
        "collective timed out: rank {rank} waited {:.1} s for rank(s) {missing:?} (timeout {:.1} s)",
        waited.as_secs_f64(), timeout.as_secs_f64()
    )]
    Timeout {
        rank: usize,
        missing: Vec<usize>,
        waited: Duration,
        timeout: Duration,
    },
    #[error("collective abandoned: rank {by} gave up ({reason})")]
    Aborted { by: usize, reason: String },
    #[error("collective between ranks: {0}")]
    Device(String),
}

struct Meeting<T, R> {
    /// Completed meetings so far; a rank waits for this to move past the meeting it joined.
    round: u64,
    deposits: Vec<Option<T>>,
    /// The last completed meeting's result, with its round.
    result: Option<(u64, Arc<R>)>,
    /// The first rank to give up, and why: every meeting after it fails at once.
    aborted: Option<(usize, String)>,
}

pub struct Rendezvous<T, R> {
    ranks: usize,
    timeout: Duration,
    meeting: Mutex<Meeting<T, R>>,
    moved: Condvar,
}

impl<T, R> Rendezvous<T, R> {
    pub fn new(ranks: usize, timeout: Duration) -> Self {
        Self {
            ranks,
            timeout,
            meeting: Mutex::new(Meeting {
                round: 0,
                deposits: std::iter::repeat_with(|| None).take(ranks).collect(),
                result: None,
                aborted: None,
            }),
            moved: Condvar::new(),
        }
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    fn lock(&self) -> MutexGuard<'_, Meeting<T, R>> {
        self.meeting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings `value` from `rank`; the last rank to arrive runs `combine` over every rank's value
    /// (rank order). Every rank gets the same result.
    pub fn exchange(
        &self,
        rank: usize,
        value: T,
        combine: impl FnOnce(Vec<T>) -> R,
    ) -> Result<Arc<R>, CollectiveError> {
        let start = Instant::now();
        let mut m = self.lock();
        if let Some((by, reason)) = &m.aborted {
            return Err(aborted(*by, reason));
        }
        if rank >= self.ranks || m.deposits[rank].is_some() {
            return Err(CollectiveError::Device(format!(
                "rank {rank} joined a meeting of {} ranks it cannot join",
                self.ranks
            )));
        }
        let round = m.round;
        m.deposits[rank] = Some(value);
        if m.deposits.iter().all(Option::is_some) {
            let values = m.deposits.iter_mut().filter_map(Option::take).collect();
            let result = Arc::new(combine(values));
            m.result = Some((round, Arc::clone(&result)));
            m.round += 1;
            self.moved.notify_all();
            return Ok(result);
        }
        let (mut m, wait) = self
            .moved
            .wait_timeout_while(m, self.timeout, |m| m.round == round && m.aborted.is_none())
            .unwrap_or_else(|p| p.into_inner());
        match &m.result {
            Some((r, result)) if *r == round => Ok(Arc::clone(result)),
            _ if wait.timed_out() => {
                let missing = (m.deposits.iter().enumerate())
                    .filter(|(_, d)| d.is_none())
                    .map(|(r, _)| r)
                    .collect();
                m.aborted = Some((rank, "timed out waiting for the others".into()));
                self.moved.notify_all();
                Err(CollectiveError::Timeout {
                    rank,
                    missing,
                    waited: start.elapsed(),
                    timeout: self.timeout,
                })
            }
            _ => {
                let (by, reason) = m.aborted.clone().unwrap_or((rank, "unknown".into()));
                Err(aborted(by, &reason))
            }
        }
    }

    /// `rank` will not come: pending and later meetings fail at once instead of at the timeout.
    pub fn abort(&self, rank: usize, reason: &str) {
        let mut m = self.lock();
        m.aborted.get_or_insert_with(|| (rank, reason.to_string()));
        self.moved.notify_all();
    }

    /// Clears an abort and any deposit: the next meeting starts afresh. Only while no rank is
    /// inside [`Rendezvous::exchange`] (a step abandoned on every rank, their work joined).
    pub fn reset(&self) {
        let mut m = self.lock();
        m.aborted = None;
        m.deposits.iter_mut().for_each(|d| *d = None);
        m.round += 1;
    }
}

fn aborted(by: usize, reason: &str) -> CollectiveError {
    CollectiveError::Aborted {
        by,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_gets_the_combination_in_rank_order() {
        let meet = Rendezvous::<usize, Vec<usize>>::new(3, Duration::from_secs(10));
        for _round in 0..3 {
            let results: Vec<Vec<usize>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..3)
                    .map(|r| {
                        let meet = &meet;
                        s.spawn(move || meet.exchange(r, r * 10, |v| v).unwrap().to_vec())
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(results.iter().all(|r| r == &vec![0, 10, 20]), "{results:?}");
        }
    }

    #[test]
    fn a_missing_rank_times_out_with_its_number_and_fails_the_others() {
        let meet = Rendezvous::<(), ()>::new(3, Duration::from_millis(150));
        let err = std::thread::scope(|s| {
            let other = s.spawn(|| meet.exchange(1, (), |_| ()));
            let mine = meet.exchange(0, (), |_| ());
            // one of the two timed out naming rank 2; the other saw the meeting abandoned or timed
            // out on its own
            let both = [mine.unwrap_err(), other.join().unwrap().unwrap_err()];
            both.into_iter()
                .find(|e| matches!(e, CollectiveError::Timeout { .. }))
                .unwrap()
        });
        let CollectiveError::Timeout { missing, .. } = &err else {
            unreachable!()
        };
        assert_eq!(missing, &vec![2]);
        assert!(err.to_string().contains("timed out"), "{err}");
        // the group stays failed: a later meeting does not wait again
        let t = Instant::now();
        assert!(matches!(
            meet.exchange(2, (), |_| ()),
            Err(CollectiveError::Aborted { .. })
        ));
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn an_abort_wakes_a_waiting_rank_at_once() {
        let meet = Rendezvous::<(), ()>::new(2, Duration::from_secs(30));
        let t = Instant::now();
        let err = std::thread::scope(|s| {
            let waiting = s.spawn(|| meet.exchange(0, (), |_| ()));
            std::thread::sleep(Duration::from_millis(50));
            meet.abort(1, "rank 1 failed its micro-batch");
            waiting.join().unwrap().unwrap_err()
        });
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            err,
            CollectiveError::Aborted {
                by: 1,
                reason: "rank 1 failed its micro-batch".into()
            }
        );
    }
}
