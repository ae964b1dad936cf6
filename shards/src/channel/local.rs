//! A bounded multi-producer, single-consumer channel inside one shard: `!Send`, no atomics, no
//! locks (an `Rc<RefCell<..>>`). Cost: a `VecDeque` push or pop per message; a waiting side
//! stores one waker.

use std::{
    cell::RefCell,
    collections::VecDeque,
    fmt,
    future::poll_fn,
    rc::Rc,
    task::{Poll, Waker},
};

use super::{check_capacity, SendError, TryRecvError, TrySendError};

struct State<T> {
    queue: VecDeque<T>,
    capacity: usize,
    rx_waker: Option<Waker>,
    tx_wakers: VecDeque<Waker>,
    senders: usize,
    rx_alive: bool,
}

/// Creates a channel holding up to `capacity` values. `Err` for a capacity of 0.
pub fn bounded<T>(capacity: usize) -> crate::Result<(Sender<T>, Receiver<T>)> {
    let st = Rc::new(RefCell::new(State {
        queue: VecDeque::with_capacity(capacity.min(1024)),
        capacity: check_capacity(capacity)?,
        rx_waker: None,
        tx_wakers: VecDeque::new(),
        senders: 1,
        rx_alive: true,
    }));
    Ok((Sender { st: st.clone() }, Receiver { st }))
}

/// The sending end; `Clone` for more producers. `!Send`.
pub struct Sender<T> {
    st: Rc<RefCell<State<T>>>,
}

/// The receiving end. `!Send`.
pub struct Receiver<T> {
    st: Rc<RefCell<State<T>>>,
}

impl<T> Sender<T> {
    /// Sends without waiting.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let mut st = self.st.borrow_mut();
        if !st.rx_alive {
            return Err(TrySendError::Closed(value));
        }
        if st.queue.len() >= st.capacity {
            return Err(TrySendError::Full(value));
        }
        st.queue.push_back(value);
        let w = st.rx_waker.take();
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
        Ok(())
    }

    /// Sends, waiting while the channel is full; `Err` gives the value back if the receiver is
    /// gone.
    pub async fn send(&self, value: T) -> Result<(), SendError<T>> {
        let mut value = Some(value);
        poll_fn(|cx| {
            let v = value.take().expect("polled after completion");
            match self.try_send(v) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(v)) => Poll::Ready(Err(SendError(v))),
                Err(TrySendError::Full(v)) => {
                    value = Some(v);
                    self.st.borrow_mut().tx_wakers.push_back(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.st.borrow_mut().senders += 1;
        Sender {
            st: self.st.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut st = self.st.borrow_mut();
        st.senders -= 1;
        let w = if st.senders == 0 {
            st.rx_waker.take()
        } else {
            None
        };
        drop(st);
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Receives without waiting.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut st = self.st.borrow_mut();
        match st.queue.pop_front() {
            Some(v) => {
                let w = st.tx_wakers.pop_front();
                drop(st);
                if let Some(w) = w {
                    w.wake();
                }
                Ok(v)
            }
            None if st.senders == 0 => Err(TryRecvError::Closed),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives the next value; `None` once every sender is gone and the channel is empty.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| match self.try_recv() {
            Ok(v) => Poll::Ready(Some(v)),
            Err(TryRecvError::Closed) => Poll::Ready(None),
            Err(TryRecvError::Empty) => {
                self.st.borrow_mut().rx_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.st.borrow_mut();
        st.rx_alive = false;
        let wakers: Vec<Waker> = st.tx_wakers.drain(..).collect();
        let items = std::mem::take(&mut st.queue);
        drop(st);
        drop(items);
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("local::Sender")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("local::Receiver")
    }
}
