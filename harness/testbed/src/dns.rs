//! A DNS stand-in: answers A and AAAA questions over UDP on loopback from a table tests fill, and
//! NXDOMAIN for names it does not know — enough for the agent's service-IP lookup.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// Names (lowercase, without the trailing dot) and their addresses.
pub type Records = Arc<Mutex<HashMap<String, Vec<IpAddr>>>>;

/// A running DNS stand-in.
pub struct Dns {
    addr: SocketAddr,
    records: Records,
    asked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Reads the question of a query: (name, qtype, end of the question section).
fn question(packet: &[u8]) -> Option<(String, u16, usize)> {
    if packet.len() < 12 || u16::from_be_bytes([packet[4], packet[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(packet.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]);
    Some((labels.join("."), qtype, at + 4))
}

fn answer(query: &[u8], records: &Records) -> Option<Vec<u8>> {
    let (name, qtype, end) = question(query)?;
    let known = records
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&name)
        .cloned();
    let addrs: Vec<IpAddr> = known
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| matches!((qtype, ip), (1, IpAddr::V4(_)) | (28, IpAddr::V6(_))))
        .collect();
    let mut out = Vec::with_capacity(end + 32 * addrs.len());
    out.extend_from_slice(&query[0..2]); // id
    let rcode = if known.is_some() { 0 } else { 3 };
    out.extend_from_slice(&[0x81, 0x80 | rcode]); // response, recursion desired and available
    out.extend_from_slice(&[0, 1]); // one question
    out.extend_from_slice(&u16::try_from(addrs.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // no authority, no additional
    out.extend_from_slice(&query[12..end]);
    for ip in addrs {
        out.extend_from_slice(&[0xC0, 0x0C]); // the name, by pointer to the question
        out.extend_from_slice(&qtype.to_be_bytes());
        out.extend_from_slice(&[0, 1, 0, 0, 0, 30]); // class IN, TTL 30
        match ip {
            IpAddr::V4(v4) => {
                out.extend_from_slice(&[0, 4]);
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.extend_from_slice(&[0, 16]);
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    Some(out)
}

impl Dns {
    /// Starts on an ephemeral loopback UDP port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts on `addr` (a loopback address; port 53 for a resolver that reads
    /// `/etc/resolv.conf`, which cannot name a port).
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let socket = tokio::net::UdpSocket::bind(addr).await?;
        let addr = socket.local_addr()?;
        let records: Records = Arc::default();
        let asked: Arc<Mutex<Vec<String>>> = Arc::default();
        let (table, log) = (records.clone(), asked.clone());
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((len, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                if let Some((name, _, _)) = question(&buf[..len]) {
                    log.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(name);
                }
                if let Some(reply) = answer(&buf[..len], &table) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Ok(Self {
            addr,
            records,
            asked,
            task,
        })
    }

    /// Every name asked about so far, in order (A and AAAA questions each).
    pub fn asked(&self) -> Vec<String> {
        self.asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the addresses of `name`.
    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                name.trim_end_matches('.').to_ascii_lowercase(),
                addrs.to_vec(),
            );
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_a_questions_and_refuses_garbage() {
        let records: Records = Arc::default();
        records.lock().unwrap().insert(
            "web.ns.svc.cluster.local".into(),
            vec!["10.96.0.10".parse().unwrap()],
        );
        // a query for web.ns.svc.cluster.local A
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in ["web", "ns", "svc", "cluster", "local"] {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let a = answer(&q, &records).unwrap();
        assert_eq!(&a[0..2], &[0x12, 0x34]);
        assert_eq!(a[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1, "one answer");
        assert_eq!(&a[a.len() - 4..], &[10, 96, 0, 10]);
        // unknown name: NXDOMAIN
        let unknown: Vec<u8> = q
            .iter()
            .map(|b| if *b == b'w' { b'x' } else { *b })
            .collect();
        assert_eq!(answer(&unknown, &records).unwrap()[3] & 0x0f, 3);
        // garbage
        assert!(answer(&[1, 2, 3], &records).is_none());
        assert!(answer(&[0; 12], &records).is_none());
    }
}
