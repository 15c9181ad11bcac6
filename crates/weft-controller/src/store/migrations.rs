//! The schema's migrations for every backend, from one versioned list: step N is version
//! N, with its SQLite text and, where PostgreSQL's differs (64-bit integers, identity
//! columns, PL/pgSQL triggers), its PostgreSQL text. A database at version N has run the
//! first N steps; one newer than [`STEPS`] is refused at start. A new migration is one
//! more [`Step`] at the end, with both texts.

/// One migration, for each backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    /// Its SQL on SQLite.
    pub sqlite: &'static str,
    /// Its SQL on PostgreSQL, when it is not the SQLite text.
    pub postgres: Option<&'static str>,
}

impl Step {
    /// The SQL on PostgreSQL.
    pub fn postgres(&self) -> &'static str {
        self.postgres.unwrap_or(self.sqlite)
    }
}

/// Every migration, in order.
pub(crate) const STEPS: &[Step] = &[
    Step {
        sqlite: include_str!("migrations/0001_schema.sql"),
        postgres: Some(include_str!("migrations/postgres/0001_schema.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0002_token_life_and_lease.sql"),
        postgres: Some(include_str!(
            "migrations/postgres/0002_token_life_and_lease.sql"
        )),
    },
    Step {
        sqlite: include_str!("migrations/0003_operation_warning.sql"),
        postgres: None,
    },
    Step {
        sqlite: include_str!("migrations/0004_server_gpus.sql"),
        postgres: Some(include_str!("migrations/postgres/0004_server_gpus.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0005_operation_taken.sql"),
        postgres: None,
    },
    Step {
        sqlite: include_str!("migrations/0006_node_leases.sql"),
        postgres: Some(include_str!("migrations/postgres/0006_node_leases.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0007_server_links.sql"),
        postgres: Some(include_str!("migrations/postgres/0007_server_links.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0008_leader.sql"),
        postgres: Some(include_str!("migrations/postgres/0008_leader.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0009_link_runs.sql"),
        postgres: Some(include_str!("migrations/postgres/0009_link_runs.sql")),
    },
    Step {
        sqlite: include_str!("migrations/0010_ports_and_console_sessions.sql"),
        postgres: Some(include_str!(
            "migrations/postgres/0010_ports_and_console_sessions.sql"
        )),
    },
    Step {
        sqlite: include_str!("migrations/0011_audit_prune.sql"),
        postgres: Some(include_str!("migrations/postgres/0011_audit_prune.sql")),
    },
];

/// Why a database's schema version cannot be run by this binary, if it cannot.
pub(crate) fn too_new(version: i64) -> Option<String> {
    (usize::try_from(version).unwrap_or(usize::MAX) > STEPS.len()).then(|| {
        format!(
            "its schema is version {version}, newer than this weft's {}: run the weft that wrote it, or a newer one",
            STEPS.len()
        )
    })
}
