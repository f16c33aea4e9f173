//! Upstream HTTP/2 connections opened one at a time, only when the open ones are full.
//!
//! pingora looks for a pooled HTTP/2 connection with a free stream and opens a new one when it
//! finds none; requests that arrive together while a connection is still in its TLS handshake all
//! find none, so a burst of N requests opens up to N connections (measured before this gate: 204
//! upstream connections for 1,000 watches started at once, each allowed 100 streams;
//! `perf/results/streams.md`). Every one of them holds TLS buffers and HTTP/2 state here and in
//! kube-apiserver for as long as a watch keeps it busy.
//!
//! [`ConnectionGate`] counts the streams it let through against the connections it has seen
//! opened. A request passes at once while that count leaves room; otherwise one request (the
//! opener) goes on to make pingora open a connection and the others wait until it reports one
//! (or gives up), then count again. Nobody waits longer than the bound given to
//! [`ConnectionGate::pass`] (the upstream's connect timeout): after it, a request goes on as it
//! would without the gate.
//!
//! The gate only sees what pingora reports: connections it opened, never those it closed. A
//! count that is too high (connections gone idle and dropped) lets requests through as if the
//! gate were not there; it never holds a request that pingora could serve.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::sync::Notify;

/// The stream accounting of one upstream pool (one [`crate::snapshot::Upstream`], HTTP/2 peers
/// with the proxy's own credential). See the module docs.
#[derive(Debug)]
pub struct ConnectionGate {
    streams_per_connection: usize,
    connections: AtomicUsize,
    streams: AtomicUsize,
    opening: AtomicBool,
    opened: Notify,
}

/// One request's place in the gate, held until the request ends: it counts as a stream until
/// dropped. The opener must call [`Ticket::connected`] once pingora has a connection for it;
/// dropping an opener's ticket first (the connection failed, the request ended) lets another
/// request try.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<ConnectionGate>,
    opener: bool,
}

impl ConnectionGate {
    /// A gate for connections that each carry at most `streams_per_connection` streams (at least 1).
    pub fn new(streams_per_connection: usize) -> Self {
        Self {
            streams_per_connection: streams_per_connection.max(1),
            connections: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            opening: AtomicBool::new(false),
            opened: Notify::new(),
        }
    }

    /// Waits until this request may go to pingora: at once when the counted connections have a
    /// free stream; as the opener when none has and nobody is opening one; otherwise after the
    /// opener reported, or after `limit`.
    pub async fn pass(self: &Arc<Self>, limit: Duration) -> Ticket {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the checks, so an opener finishing in between is not missed.
            opened.as_mut().enable();
            if self.try_take_stream() {
                return self.ticket(false);
            }
            if self
                .opening
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.streams.fetch_add(1, Ordering::AcqRel);
                return self.ticket(true);
            }
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                self.streams.fetch_add(1, Ordering::AcqRel);
                return self.ticket(false);
            }
        }
    }

    /// Connections counted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Streams (requests) currently counted.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Acquire)
    }

    fn try_take_stream(&self) -> bool {
        let capacity = self
            .connections
            .load(Ordering::Acquire)
            .saturating_mul(self.streams_per_connection);
        self.streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |streams| {
                (streams < capacity).then_some(streams + 1)
            })
            .is_ok()
    }

    fn ticket(self: &Arc<Self>, opener: bool) -> Ticket {
        Ticket {
            gate: Arc::clone(self),
            opener,
        }
    }

    fn finish_opening(&self) {
        self.opening.store(false, Ordering::Release);
        self.opened.notify_waiters();
    }
}

impl Ticket {
    /// Whether this request is the one making pingora open a connection.
    pub fn is_opener(&self) -> bool {
        self.opener
    }

    /// Records that pingora has this request's upstream connection (`reused`: a pooled one). A
    /// new connection adds its streams to the count, whoever opened it; the opener's report
    /// releases the requests waiting for it.
    pub fn connected(&mut self, reused: bool) {
        let gate = &self.gate;
        if !reused {
            gate.connections.fetch_add(1, Ordering::AcqRel);
        } else if gate.connections.load(Ordering::Acquire) == 0 {
            // The pool already had a connection (opened under an earlier snapshot's gate).
            gate.connections.store(1, Ordering::Release);
        }
        if std::mem::take(&mut self.opener) {
            gate.finish_opening();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.streams.fetch_sub(1, Ordering::AcqRel);
        if self.opener {
            self.gate.finish_opening();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn the_first_request_opens_and_the_others_wait_for_its_connection() {
        let gate = Arc::new(ConnectionGate::new(3));
        let mut opener = gate.pass(LIMIT).await;
        assert!(opener.is_opener());
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let gate = Arc::clone(&gate);
                tokio::spawn(async move { gate.pass(LIMIT).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            waiting.iter().all(|task| !task.is_finished()),
            "they wait while the first connection opens"
        );

        opener.connected(false);
        let mut tickets = Vec::new();
        for task in waiting {
            tickets.push(tokio::time::timeout(LIMIT, task).await.unwrap().unwrap());
        }
        // Capacity 3 (one connection): the opener's stream and two more pass; the third waiting
        // request becomes the opener of a second connection.
        assert_eq!(tickets.iter().filter(|t| t.is_opener()).count(), 1);
        assert_eq!(gate.streams(), 4);
        assert_eq!(gate.connections(), 1);
    }

    #[tokio::test]
    async fn streams_free_up_when_requests_end() {
        let gate = Arc::new(ConnectionGate::new(1));
        let mut opener = gate.pass(LIMIT).await;
        opener.connected(false);
        drop(opener);
        assert_eq!(gate.streams(), 0);
        let next = gate.pass(LIMIT).await;
        assert!(
            !next.is_opener(),
            "the counted connection has a free stream again"
        );
        assert_eq!(gate.streams(), 1);
    }

    #[tokio::test]
    async fn an_opener_that_fails_lets_the_next_request_open() {
        let gate = Arc::new(ConnectionGate::new(10));
        let opener = gate.pass(LIMIT).await;
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.pass(LIMIT).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(opener); // the connection failed: never connected
        let ticket = tokio::time::timeout(LIMIT, waiter).await.unwrap().unwrap();
        assert!(ticket.is_opener());
        assert_eq!(gate.connections(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn nobody_waits_longer_than_the_limit() {
        let gate = Arc::new(ConnectionGate::new(10));
        let _opener = gate.pass(LIMIT).await;
        let started = tokio::time::Instant::now();
        let ticket = gate.pass(Duration::from_millis(300)).await;
        assert!(!ticket.is_opener());
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(gate.streams(), 2);
    }

    #[tokio::test]
    async fn a_pooled_connection_found_by_the_opener_counts_as_one() {
        let gate = Arc::new(ConnectionGate::new(3));
        let mut opener = gate.pass(LIMIT).await;
        opener.connected(true);
        assert_eq!(gate.connections(), 1);
        let others = [gate.pass(LIMIT).await, gate.pass(LIMIT).await];
        assert!(others.iter().all(|t| !t.is_opener()));
    }

    #[tokio::test(start_paused = true)]
    async fn connections_pingora_opened_on_its_own_are_counted() {
        let gate = Arc::new(ConnectionGate::new(1));
        let mut opener = gate.pass(LIMIT).await;
        // Gave up waiting for the opener; pingora opened a connection for it as well.
        let mut impatient = gate.pass(Duration::from_millis(10)).await;
        assert!(!impatient.is_opener());
        impatient.connected(false);
        opener.connected(false);
        assert_eq!(gate.connections(), 2);
        drop((opener, impatient));
        let tickets = [gate.pass(LIMIT).await, gate.pass(LIMIT).await];
        assert!(
            tickets.iter().all(|t| !t.is_opener()),
            "two counted connections, one stream each"
        );
    }
}
