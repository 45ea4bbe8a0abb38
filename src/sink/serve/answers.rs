//! One handler call's records as consumers answer them: a result per record, filled in by the
//! dispatcher, and the future the call awaits ([`Answers`]), woken once, when its last record
//! is answered, rather than once per record.
//!
//! The common answer, a FIN, costs one atomic decrement; only failures take the call's lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;

use crate::sink::HandlerError;

/// What the records of one call share.
struct Call {
    /// Records not answered yet.
    left: AtomicUsize,
    /// The failures so far, by the record's place in the call; most calls have none.
    failures: Mutex<Vec<(usize, HandlerError)>>,
    /// The call's task, once it waits.
    waker: AtomicWaker,
    /// Set when the call's future is dropped (abandoned at shutdown): its records that still
    /// wait for a consumer are not sent.
    abandoned: AtomicBool,
}

/// A record's place in its handler call; answered exactly once, by [`Reply::resolve`] or, if
/// the dispatcher drops it unanswered, as a failure.
pub(crate) struct Reply {
    call: Arc<Call>,
    index: usize,
    answered: bool,
}

impl Reply {
    /// Answers the record. Returns the call's waker when this was its last record: the
    /// caller wakes it once it has released its lock.
    #[must_use = "the call waits until its waker is woken"]
    pub(crate) fn resolve(mut self, result: Result<(), HandlerError>) -> Option<Waker> {
        self.answered = true;
        self.call.answer(self.index, result)
    }

    /// Whether the call no longer waits for this record.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.call.abandoned.load(Ordering::Relaxed)
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.answered {
            let stopped = HandlerError::Retry("the serve endpoint stopped".into());
            if let Some(waker) = self.call.answer(self.index, Err(stopped)) {
                waker.wake();
            }
        }
    }
}

impl Call {
    fn answer(&self, index: usize, result: Result<(), HandlerError>) -> Option<Waker> {
        if let Err(error) = result {
            self.failures
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push((index, error));
        }
        // AcqRel: the failure pushed above is seen by the task that sees the count at 0.
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.waker.take()
        } else {
            None
        }
    }
}

/// The results of one handler call's records, in their order, once every record is answered.
pub(crate) struct Answers {
    call: Arc<Call>,
    count: usize,
}

impl Answers {
    /// A call of `count` records, and the reply of each, in order.
    pub(crate) fn new(count: usize) -> (Answers, impl Iterator<Item = Reply>) {
        let call = Arc::new(Call {
            left: AtomicUsize::new(count),
            failures: Mutex::new(Vec::new()),
            waker: AtomicWaker::new(),
            abandoned: AtomicBool::new(false),
        });
        let replies = {
            let call = call.clone();
            (0..count).map(move |index| Reply {
                call: call.clone(),
                index,
                answered: false,
            })
        };
        (Answers { call, count }, replies)
    }

    fn results(&self) -> Vec<Result<(), HandlerError>> {
        let mut results = vec![Ok(()); self.count];
        let failures = std::mem::take(
            &mut *self
                .call
                .failures
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (index, error) in failures {
            results[index] = Err(error);
        }
        results
    }
}

impl Future for Answers {
    type Output = Vec<Result<(), HandlerError>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.call.left.load(Ordering::Acquire) != 0 {
            self.call.waker.register(cx.waker());
            // Checked again: the last answer may have come before the waker was registered.
            if self.call.left.load(Ordering::Acquire) != 0 {
                return Poll::Pending;
            }
        }
        Poll::Ready(self.results())
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.call.abandoned.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn the_call_is_ready_once_every_record_is_answered_with_its_own_result() {
        let (mut answers, replies) = Answers::new(3);
        let mut replies: Vec<Reply> = replies.collect();
        let third = replies.pop().unwrap();
        let second = replies.pop().unwrap();
        let first = replies.pop().unwrap();
        assert!(first.resolve(Ok(())).is_none());
        assert!((&mut answers).now_or_never().is_none());
        assert!(third
            .resolve(Err(HandlerError::Retry("requeued".into())))
            .is_none());
        // The last answer hands back the waker of the call that waits.
        assert!(second.resolve(Ok(())).is_some());
        assert_eq!(
            answers.now_or_never().unwrap(),
            vec![Ok(()), Ok(()), Err(HandlerError::Retry("requeued".into()))]
        );
    }

    #[test]
    fn a_reply_dropped_unanswered_fails_its_record_and_a_dropped_call_is_abandoned() {
        let (answers, replies) = Answers::new(2);
        let mut replies: Vec<Reply> = replies.collect();
        drop(replies.pop());
        assert!(!replies[0].is_abandoned());
        drop(answers);
        assert!(replies[0].is_abandoned());
        let (answers, replies) = Answers::new(1);
        drop(replies.collect::<Vec<_>>());
        assert_eq!(
            answers.now_or_never().unwrap(),
            vec![Err(HandlerError::Retry(
                "the serve endpoint stopped".into()
            ))]
        );
    }
}
