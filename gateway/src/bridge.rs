//! From kneepoint-client's blocking submit API to futures: one [`Client`]
//! (one UDP socket) shared by every HTTP request, whose receiver thread
//! completes each request's oneshot channel as its answer comes
//! ([`Client::on_result`]).
//!
//! Why not `spawn_blocking(|| client.infer(..))`: that parks one blocking
//! thread per request in flight (tokio's pool grows to 512 of them, each
//! with its stack), and every answer wakes its own thread. Here a request
//! in flight costs a map entry and a oneshot; `submit` only cuts and sends
//! the datagrams (a few `sendmmsg` calls, done on the calling task: a UDP
//! send does not wait for the peer), and the client's receiver thread
//! hands every answer to its task. Why not a thread of ours blocked in
//! `Client::poll`: that is one more cross-thread wake-up per answer (the
//! receiver wakes the poller, the poller wakes the task). Each request
//! ends exactly once (the client guarantees an answer, an error or its
//! timeout), so no entry is left behind; a task that gave up (its HTTP
//! connection closed) just drops its receiver and the answer is discarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kneepoint_client::{Answer, Client, ClientError};
use tokio::sync::oneshot;

type Outcome = Result<Answer, ClientError>;

/// A request's place in the table: a task waiting for it, or its result
/// when the receiver had it before `submit` returned (a fast UNKNOWN_IF).
#[derive(Debug)]
enum Slot {
    Waiting(oneshot::Sender<Outcome>),
    Done(Outcome),
}

#[derive(Debug, Default)]
struct Table(Mutex<HashMap<u64, Slot>>);

impl Table {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The platform, as futures: [`Bridge::submit`].
#[derive(Debug)]
pub struct Bridge {
    client: Client,
    table: Arc<Table>,
}

impl Bridge {
    /// Has `client`'s receiver thread complete the bridge's requests.
    pub fn new(client: Client) -> Result<Bridge, ClientError> {
        let table = Arc::new(Table::default());
        let t = Arc::clone(&table);
        client.on_result(move |id, result| {
            let mut table = t.lock();
            match table.remove(&id.0) {
                // A receiver gone (the HTTP request was dropped) is no
                // error.
                Some(Slot::Waiting(tx)) => drop(tx.send(result)),
                Some(Slot::Done(_)) | None => {
                    table.insert(id.0, Slot::Done(result));
                }
            }
        })?;
        Ok(Bridge { client, table })
    }

    /// The client underneath (its counters, its address).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends `input` to `if_id` now, and returns a future of its result
    /// (ends by `timeout` at the latest).
    pub fn submit(
        &self,
        if_id: u16,
        input: &[u8],
        timeout: Duration,
    ) -> Result<impl std::future::Future<Output = Outcome> + use<>, ClientError> {
        let id = self.client.submit_with_timeout(if_id, input, timeout)?;
        let (tx, rx) = oneshot::channel();
        let early = {
            let mut table = self.table.lock();
            match table.remove(&id.0) {
                Some(Slot::Done(result)) => Some(result),
                Some(Slot::Waiting(_)) | None => {
                    table.insert(id.0, Slot::Waiting(tx));
                    None
                }
            }
        };
        Ok(async move {
            match early {
                Some(result) => result,
                // The receiver only drops a sender after sending on it, or
                // when the client is dropped.
                None => rx
                    .await
                    .unwrap_or_else(|_| Err(ClientError::Config("gateway shutting down".into()))),
            }
        })
    }

    /// Requests waiting for their answer now.
    pub fn in_flight(&self) -> usize {
        self.table
            .lock()
            .values()
            .filter(|s| matches!(s, Slot::Waiting(_)))
            .count()
    }
}
