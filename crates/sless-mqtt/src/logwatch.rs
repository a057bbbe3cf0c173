//! Reading mosquitto's log (its stderr, one line a record, no timestamps): who is
//! connected (mosquitto tells nobody else), and the refusals the server's log must
//! show — a publish the ACL denied (mosquitto's own debug line), a subscription to
//! anything but the device's command topic (the plugin refuses it without a word,
//! so sless names it from the SUBSCRIBE lines), refused credentials.

use std::collections::HashMap;

use sless_core::device;

/// What one log line says, where it says something sless acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    /// `New client connected from ADDR as CLIENT (p2, c1, k60, u'USER').`
    Connected {
        client: String,
        username: String,
    },
    /// `Client CLIENT disconnected.` and the other ways a connection ends.
    Disconnected {
        client: String,
    },
    /// `Denied PUBLISH from CLIENT (d0, q1, r0, m1, 'TOPIC', ... (N bytes))`
    DeniedPublish {
        client: String,
        topic: String,
    },
    /// `Received SUBSCRIBE from CLIENT`, then one `\tFILTER (QoS n)` line per filter.
    Subscribe {
        client: String,
    },
    SubscribeFilter {
        filter: String,
    },
    /// `Client <unknown> disconnected, not authorised.`
    RefusedLogin,
}

/// Parses one line; `None` for everything sless ignores.
pub fn parse(line: &str) -> Option<LogEvent> {
    if let Some(rest) = line.strip_prefix("New client connected from ") {
        let (_, rest) = rest.split_once(" as ")?;
        let (client, rest) = rest.split_once(" (")?;
        let username = rest.split_once("u'").map(|(_, u)| u).unwrap_or_default();
        let username = username.strip_suffix("').").unwrap_or(username);
        return Some(LogEvent::Connected {
            client: client.to_string(),
            username: username.to_string(),
        });
    }
    if let Some(rest) = line.strip_prefix("Denied PUBLISH from ") {
        let (client, rest) = rest.split_once(" (")?;
        let topic = rest.split('\'').nth(1).unwrap_or_default();
        return Some(LogEvent::DeniedPublish {
            client: client.to_string(),
            topic: topic.to_string(),
        });
    }
    if let Some(client) = line.strip_prefix("Received SUBSCRIBE from ") {
        return Some(LogEvent::Subscribe {
            client: client.to_string(),
        });
    }
    if let Some(rest) = line.strip_prefix('\t') {
        let (filter, _) = rest.rsplit_once(" (QoS ")?;
        return Some(LogEvent::SubscribeFilter {
            filter: filter.to_string(),
        });
    }
    for prefix in [
        "Bad socket read/write on client ",
        "Socket error on client ",
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let client = rest.split([':', ',']).next().unwrap_or(rest);
            return Some(LogEvent::Disconnected {
                client: client.to_string(),
            });
        }
    }
    if line.starts_with("Client <unknown> disconnected, not authorised") {
        return Some(LogEvent::RefusedLogin);
    }
    if let Some(rest) = line.strip_prefix("Client ") {
        let (client, tail) = rest.split_once(' ')?;
        let ended = tail.starts_with("disconnected")
            || tail.starts_with("closed its connection")
            || tail.starts_with("has exceeded timeout");
        if ended {
            return Some(LogEvent::Disconnected {
                client: client.to_string(),
            });
        }
    }
    None
}

/// Who is connected, by username, from the log; and what to tell the server's log.
#[derive(Debug, Default)]
pub struct Presence {
    /// Client id → username of every live connection.
    clients: HashMap<String, String>,
    /// Username → live connections.
    online: HashMap<String, usize>,
    /// The client whose SUBSCRIBE filters are being listed.
    subscribing: Option<String>,
}

/// A refusal to log, named by device where the client is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Publish { username: String, topic: String },
    Subscribe { username: String, filter: String },
    Login,
}

impl Presence {
    /// Takes one log line; returns a refusal to log, if it is one.
    pub fn line(&mut self, line: &str) -> Option<Refusal> {
        match parse(line)? {
            LogEvent::Connected { client, username } => {
                // A client id taking over an old connection: the old one ends.
                self.end(&client);
                *self.online.entry(username.clone()).or_default() += 1;
                self.clients.insert(client, username);
                None
            }
            LogEvent::Disconnected { client } => {
                self.end(&client);
                None
            }
            LogEvent::DeniedPublish { client, topic } => Some(Refusal::Publish {
                username: self.clients.get(&client).cloned().unwrap_or(client),
                topic,
            }),
            LogEvent::Subscribe { client } => {
                self.subscribing = Some(client);
                None
            }
            LogEvent::SubscribeFilter { filter } => {
                let client = self.subscribing.as_ref()?;
                let username = self.clients.get(client)?;
                let (ns, name) = device::parse_username(username)?;
                (filter != device::commands_topic(ns, name)).then(|| Refusal::Subscribe {
                    username: username.clone(),
                    filter,
                })
            }
            LogEvent::RefusedLogin => Some(Refusal::Login),
        }
    }

    fn end(&mut self, client: &str) {
        if let Some(username) = self.clients.remove(client)
            && let Some(n) = self.online.get_mut(&username)
        {
            *n -= 1;
            if *n == 0 {
                self.online.remove(&username);
            }
        }
    }

    /// Whether any connection with `username` is live.
    pub fn is_online(&self, username: &str) -> bool {
        self.online.contains_key(username)
    }

    /// The broker went away: nobody is connected.
    pub fn clear(&mut self) {
        self.clients.clear();
        self.online.clear();
        self.subscribing = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_mosquitto_2_0_writes() {
        assert_eq!(
            parse("New client connected from 127.0.0.1:39658 as devA (p5, c1, k60, u'ns1_a')."),
            Some(LogEvent::Connected {
                client: "devA".into(),
                username: "ns1_a".into()
            })
        );
        assert_eq!(
            parse(
                "Denied PUBLISH from auto-BC5B (d0, q1, r0, m1, 'ns1/telemetry/zz', ... (1 bytes))"
            ),
            Some(LogEvent::DeniedPublish {
                client: "auto-BC5B".into(),
                topic: "ns1/telemetry/zz".into()
            })
        );
        for l in [
            "Client devA disconnected.",
            "Client devA closed its connection.",
            "Client devA has exceeded timeout, disconnecting.",
            "Client devA disconnected due to protocol error.",
            "Bad socket read/write on client devA: Unknown error.",
            "Socket error on client devA, disconnecting.",
        ] {
            assert_eq!(
                parse(l),
                Some(LogEvent::Disconnected {
                    client: "devA".into()
                }),
                "{l}"
            );
        }
        assert_eq!(
            parse("\tns1/commands/a (QoS 1)"),
            Some(LogEvent::SubscribeFilter {
                filter: "ns1/commands/a".into()
            })
        );
        assert_eq!(
            parse("Client <unknown> disconnected, not authorised."),
            Some(LogEvent::RefusedLogin)
        );
        assert_eq!(parse("Sending CONNACK to devA (0, 0)"), None);
    }

    #[test]
    fn presence_follows_connections_and_names_refusals() {
        let mut p = Presence::default();
        p.line("New client connected from 127.0.0.1:1 as c1 (p2, c1, k60, u'ns_d').");
        p.line("New client connected from 127.0.0.1:2 as c2 (p2, c1, k60, u'ns_d').");
        assert!(p.is_online("ns_d"));
        p.line("Client c1 disconnected.");
        assert!(p.is_online("ns_d"));
        assert_eq!(
            p.line("Denied PUBLISH from c2 (d0, q1, r0, m1, 'ns/telemetry/x', ... (1 bytes))"),
            Some(Refusal::Publish {
                username: "ns_d".into(),
                topic: "ns/telemetry/x".into()
            })
        );
        assert_eq!(p.line("Received SUBSCRIBE from c2"), None);
        assert_eq!(p.line("\tns/commands/d (QoS 1)"), None);
        assert_eq!(
            p.line("\t# (QoS 1)"),
            Some(Refusal::Subscribe {
                username: "ns_d".into(),
                filter: "#".into()
            })
        );
        // A takeover by the same client id ends the old connection.
        p.line("New client connected from 127.0.0.1:3 as c2 (p2, c1, k60, u'ns_d').");
        p.line("Client c2 closed its connection.");
        assert!(!p.is_online("ns_d"));
        p.line("New client connected from 127.0.0.1:4 as c3 (p2, c1, k60, u'ns_e').");
        p.clear();
        assert!(!p.is_online("ns_e"));
    }
}
