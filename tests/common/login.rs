//! A simulated agent's enrolment and login, on the wire as svc-agent does them, for tests and
//! benches that need hundreds of agents without hundreds of processes (tests/storm.rs,
//! bench/fleet.rs).

use std::io::{Error, ErrorKind};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use base64::Engine;
use futures_util::StreamExt;
use ring::signature::EcdsaKeyPair;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// An enrolled simulated agent: its id, certificate, key, and the server's command key (the
/// certificate PEM svc-agent bootstrap writes to command-key.pem).
pub struct Identity {
    pub id: String,
    pub cert_pem: String,
    pub key: EcdsaKeyPair,
    /// The same key as PKCS#8 PEM (svc-agent's key.pem), to save and load an enrolment.
    pub key_pem: String,
    /// Signs its heartbeats and results, as svc-agent does (it enrols as a signing agent).
    pub signer: svc::fleet::agent_signature::AgentSigner,
    pub command_key: String,
    /// On a cluster whose NATS checks JWTs (`bus.external_auth: jwt`): the user JWT
    /// enrolment gave and the nkey it was issued to (svc-agent's bus.jwt and bus.nk). None:
    /// the agent logs in with its certificate and a signed nonce, as on the embedded broker.
    pub bus_jwt: Option<BusJwt>,
}

/// An agent's NATS user JWT and its nkey (the seed, as bus.nk holds it).
pub struct BusJwt {
    pub jwt: String,
    pub seed: String,
    key: nkeys::KeyPair,
}

impl BusJwt {
    pub fn new(jwt: String, seed: String) -> BusJwt {
        let key = nkeys::KeyPair::from_seed(&seed).unwrap();
        BusJwt { jwt, seed, key }
    }
}

impl Identity {
    /// An enrolment saved before: what `svc-agent bootstrap` leaves in its state dir.
    pub fn load(id: String, cert_pem: String, key_pem: String, command_key: String) -> Identity {
        let der = rcgen::KeyPair::from_pem(&key_pem).unwrap().serialize_der();
        let key = EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &der,
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        let signer = svc::fleet::agent_signature::AgentSigner::from_pkcs8_pem(&key_pem).unwrap();
        Identity {
            id,
            cert_pem,
            key,
            key_pem,
            signer,
            command_key,
            bus_jwt: None,
        }
    }

    /// The same identity logging in with a NATS user JWT and its nkey.
    pub fn with_bus_jwt(mut self, bus_jwt: Option<BusJwt>) -> Identity {
        self.bus_jwt = bus_jwt;
        self
    }

    /// `HPUB svc.agent.<id>.<kind>` of `body`, signed as the agent signs what it publishes.
    pub fn publish(&self, kind: &str, body: &[u8]) -> Vec<u8> {
        let subject = format!("svc.agent.{}.{kind}", self.id);
        let signature = self.signer.sign(&subject, body).unwrap();
        let headers = format!(
            "NATS/1.0\r\n{}: {signature}\r\n\r\n",
            svc::fleet::signature::HEADER
        );
        let mut out = format!(
            "HPUB {subject} {} {}\r\n{headers}",
            headers.len(),
            headers.len() + body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// Enrols agents `range` (ids `sim-00000`...) over `svc.enroll` with the label `sim=GROUP`, 32
/// at a time, as svc-agent bootstrap does (anonymous connection, private inbox prefix);
/// `psk` gives an id's bootstrap PSK.
pub async fn enrol(
    bus: &str,
    range: std::ops::Range<usize>,
    group: &str,
    psk: fn(&str) -> String,
) -> Vec<Arc<Identity>> {
    enrol_with(bus, None, range, group, psk).await
}

/// [`enrol`], on a cluster whose NATS checks JWTs when `enrol_jwt` is given: as svc-agent
/// bootstrap `--enrol-jwt` does, the connection presents the cluster's enrolment JWT and
/// each request carries a new user nkey, whose JWT (`Enrolled.bus_jwt`) the agent then logs in
/// with.
pub async fn enrol_with(
    bus: &str,
    enrol_jwt: Option<&str>,
    range: std::ops::Range<usize>,
    group: &str,
    psk: fn(&str) -> String,
) -> Vec<Arc<Identity>> {
    let client = svc::agent::enrolment_options(enrol_jwt.map(str::to_string))
        .connect(bus)
        .await
        .unwrap();
    let jwt_mode = enrol_jwt.is_some();
    futures_util::stream::iter(range)
        .map(|n| {
            let client = client.clone();
            async move {
                let id = format!("sim-{n:05}");
                let key = rcgen::KeyPair::generate().unwrap();
                let mut params = rcgen::CertificateParams::default();
                params
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, id.as_str());
                let csr = params.serialize_request(&key).unwrap().pem().unwrap();
                let nkey = jwt_mode.then(nkeys::KeyPair::new_user);
                let request = svc::identity::EnrolRequest {
                    agent_id: id.clone(),
                    csr,
                    psk: Some(psk(&id)),
                    labels: [("sim".to_string(), group.to_string())].into(),
                    token: None,
                    bus_nkey: nkey.as_ref().map(|k| k.public_key()),
                    signs_messages: true,
                };
                let reply = client
                    .request("svc.enroll", serde_json::to_vec(&request).unwrap().into())
                    .await
                    .unwrap();
                let answer: svc::identity::Enrolled = serde_json::from_slice(&reply.payload)
                    .unwrap_or_else(|e| {
                        panic!(
                            "enrolment of {id} refused ({e}): {}",
                            String::from_utf8_lossy(&reply.payload)
                        )
                    });
                assert!(
                    !answer.command_key.is_empty(),
                    "the server sent {id} no command key: it would refuse every command"
                );
                let bus_jwt = nkey.map(|nkey| {
                    assert!(
                        !answer.bus_jwt.is_empty(),
                        "the server sent {id} no bus JWT for its nkey"
                    );
                    BusJwt::new(answer.bus_jwt.clone(), nkey.seed().unwrap())
                });
                Arc::new(
                    Identity::load(
                        id,
                        answer.certificate,
                        key.serialize_pem(),
                        answer.command_key,
                    )
                    .with_bus_jwt(bus_jwt),
                )
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// The n-th agent's source address: 127.1.0.1, 127.1.0.2, ... (16 million before wrapping):
/// the whole of 127.0.0.0/8 reaches the server, so the ephemeral port range does not cap the
/// count.
pub fn source_address(n: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(127, 1, 0, 0));
    Ipv4Addr::from(base + 1 + (n as u32 % 0x00fe_0000))
}

/// CONNECT as svc-agent sends it: async-nats' own ConnectInfo, filled as its connector fills it
/// for the agent's auth callback (`svc::agent::connect_options`): the certificate in `jwt`, the
/// nonce's ECDSA signature (base64url) in `pass`; or, with a bus JWT
/// (`svc::bus::natsjwt::connect_options_with`), the user JWT in `jwt` and the nonce's nkey
/// (ed25519) signature, base64url without padding, in `sig`.
pub fn connect_line(identity: &Identity, nonce: &str) -> String {
    let base64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let (user_jwt, signature, pass) = match &identity.bus_jwt {
        Some(bus) => (
            bus.jwt.clone(),
            Some(base64(&bus.key.sign(nonce.as_bytes()).unwrap())),
            None,
        ),
        None => {
            let signature = identity
                .key
                .sign(&ring::rand::SystemRandom::new(), nonce.as_bytes())
                .unwrap();
            (
                identity.cert_pem.clone(),
                None,
                Some(base64(signature.as_ref())),
            )
        }
    };
    let info = async_nats::ConnectInfo {
        verbose: false,
        pedantic: false,
        user_jwt: Some(user_jwt),
        nkey: None,
        signature,
        name: Some(format!("svc-agent {}", identity.id)),
        echo: true,
        lang: "rust".into(),
        version: "simulated".into(),
        protocol: async_nats::Protocol::Dynamic,
        tls_required: false,
        user: None,
        pass,
        auth_token: None,
        headers: true,
        no_responders: true,
    };
    format!("CONNECT {}\r\n", serde_json::to_string(&info).unwrap())
}

/// Reads protocol lines until PONG, answering PINGs; an error on -ERR or a closed connection.
pub async fn until_pong<R: AsyncBufReadExt + Unpin, W: AsyncWriteExt + Unpin>(
    reader: &mut R,
    write: &mut W,
) -> std::io::Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            return Err(Error::new(ErrorKind::UnexpectedEof, "closed during login"));
        }
        match line.trim_end() {
            "PONG" => return Ok(()),
            "PING" => write.write_all(b"PONG\r\n").await?,
            other if other.starts_with("-ERR") => return Err(Error::other(other.to_string())),
            _ => {}
        }
    }
}

/// How long a login may take before the agent gives up on it and retries: async-nats'
/// `connection_timeout`, which svc-agent leaves at its default.
pub const LOGIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects from `source` to the plain-TCP bus at `bus` and logs in as `identity` (INFO,
/// CONNECT with the signed nonce, PING until PONG), giving up after [`LOGIN_TIMEOUT`].
pub async fn login(
    identity: &Identity,
    bus: SocketAddr,
    source: Ipv4Addr,
) -> std::io::Result<(BufReader<OwnedReadHalf>, OwnedWriteHalf)> {
    tokio::time::timeout(LOGIN_TIMEOUT, login_unbounded(identity, bus, source))
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, "login timed out"))?
}

async fn login_unbounded(
    identity: &Identity,
    bus: SocketAddr,
    source: Ipv4Addr,
) -> std::io::Result<(BufReader<OwnedReadHalf>, OwnedWriteHalf)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    let stream = socket.connect(bus).await?;
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Err(Error::new(ErrorKind::UnexpectedEof, "closed before INFO"));
    }
    let info: serde_json::Value = serde_json::from_str(line.trim().trim_start_matches("INFO "))
        .map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
    // nats-server without auth sends no nonce; async-nats then signs the empty one.
    let nonce = info["nonce"].as_str().unwrap_or_default();
    let login = format!("{}PING\r\n", connect_line(identity, nonce));
    write.write_all(login.as_bytes()).await?;
    until_pong(&mut reader, &mut write).await?;
    Ok((reader, write))
}

/// `HPUB svc.agent.<id>.heartbeat`, as the agent sends it: signed, stamped with its send
/// time; its first heartbeat carries the host's facts, later ones do not.
pub fn heartbeat(identity: &Identity, facts: Option<svc::facts::Facts>) -> Vec<u8> {
    let body = serde_json::to_vec(&svc::fleet::protocol::Heartbeat {
        version: "sim".into(),
        hostname: identity.id.clone(),
        running_jobs: 0,
        facts,
        command_keys: None,
        sent_at_ms: Some(svc::clock::now_millis() as u64),
    })
    .unwrap();
    identity.publish("heartbeat", &body)
}
