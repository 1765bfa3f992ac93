//! A minimal cluster DNS for the real nodes (no CoreDNS image can be pulled here): answers A
//! queries for `<service>.<namespace>.svc.<domain>` (the ClusterIP, or the ready endpoint addresses
//! of a headless Service) and `<hostname>.<service>.<namespace>.svc.<domain>` (a StatefulSet pod
//! behind a headless Service) from the cluster's API, over UDP on its own address; NXDOMAIN for
//! anything else. kubelet's `clusterDNS` points pods at it, so Services resolve by name as in a
//! real cluster.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The cluster domain (kubelet's `clusterDomain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Seconds resolvers may cache an answer.
const TTL: u32 = 5;

/// A running DNS server; stopped when dropped.
#[derive(Debug)]
pub struct ClusterDns {
    /// Where it listens (`<ip>:53`).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ClusterDns {
    /// Serves the Services of `client`'s cluster on `ip:53` (UDP).
    pub async fn start(ip: Ipv4Addr, client: Client) -> Result<Self> {
        let addr = SocketAddr::from((ip, 53));
        let socket = UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding the cluster DNS to {addr}"))?;
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                if let Some(reply) = answer(&client, &buf[..n]).await {
                    let _ = socket.send_to(&reply, peer).await;
                }
            }
        });
        Ok(Self { addr, task })
    }
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The question of a query: (name in lower case without the trailing dot, qtype, end offset of
/// the question section).
fn parse_question(query: &[u8]) -> Option<(String, u16, usize)> {
    if query.len() < 12 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut i = 12;
    loop {
        let len = usize::from(*query.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None; // compression is not used in questions
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    Some((labels.join("."), qtype, i + 4))
}

/// The addresses of `name`, `None` if it does not exist.
async fn resolve(client: &Client, name: &str) -> Option<Vec<Ipv4Addr>> {
    let rest = name.strip_suffix(&format!(".svc.{CLUSTER_DOMAIN}"))?;
    let labels: Vec<&str> = rest.split('.').collect();
    let (host, svc, ns) = match labels.as_slice() {
        [svc, ns] => (None, *svc, *ns),
        [host, svc, ns] => (Some(*host), *svc, *ns),
        _ => return None,
    };
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(svc)
        .await
        .ok()??;
    let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone());
    if host.is_none()
        && let Some(ip) = cluster_ip
            .as_deref()
            .filter(|ip| *ip != "None")
            .and_then(|ip| ip.parse().ok())
    {
        return Some(vec![ip]);
    }
    // Headless Service (or a pod's name under it): ready endpoint addresses.
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .ok()?;
    let addrs: Vec<Ipv4Addr> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| host.is_none_or(|h| e.hostname.as_deref() == Some(h)))
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse().ok())
        .collect();
    if host.is_some() && addrs.is_empty() {
        return None;
    }
    Some(addrs)
}

/// The reply to one query (`None` for what is not a query).
async fn answer(client: &Client, query: &[u8]) -> Option<Vec<u8>> {
    let (name, qtype, end) = parse_question(query)?;
    if query[2] & 0x80 != 0 {
        return None; // a response, not a query
    }
    let found = resolve(client, &name).await;
    let mut reply = query[..end].to_vec();
    // QR=1, opcode 0, AA=1, RD as asked; RA=0; RCODE 0 or 3 (NXDOMAIN).
    reply[2] = 0x84 | (query[2] & 0x01);
    reply[3] = if found.is_some() { 0 } else { 3 };
    let answers: Vec<Ipv4Addr> = match (&found, qtype) {
        (Some(ips), 1 | 255) => ips.clone(),
        _ => Vec::new(),
    };
    let count = u16::try_from(answers.len()).unwrap_or(0);
    reply[6..8].copy_from_slice(&count.to_be_bytes()); // ANCOUNT
    reply[8..12].copy_from_slice(&[0, 0, 0, 0]); // NSCOUNT, ARCOUNT
    for ip in answers.iter().take(usize::from(count)) {
        reply.extend_from_slice(&[0xC0, 0x0C]); // the question's name
        reply.extend_from_slice(&1u16.to_be_bytes()); // A
        reply.extend_from_slice(&1u16.to_be_bytes()); // IN
        reply.extend_from_slice(&TTL.to_be_bytes());
        reply.extend_from_slice(&4u16.to_be_bytes());
        reply.extend_from_slice(&ip.octets());
    }
    Some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_question() {
        // id 0x1234, RD, one question: Flwr.default.svc.cluster.local A IN
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in ["Flwr", "default", "svc", "cluster", "local"] {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let (name, qtype, end) = parse_question(&q).expect("a question");
        assert_eq!(name, "flwr.default.svc.cluster.local");
        assert_eq!(qtype, 1);
        assert_eq!(end, q.len());
    }
}
