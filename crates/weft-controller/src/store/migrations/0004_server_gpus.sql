-- Migration 4: the GPUs each agent reports (weft_agent::Gpu as JSON), for `weft plan --group`.
CREATE TABLE server_gpus (server TEXT PRIMARY KEY, gpus TEXT NOT NULL, reported INTEGER NOT NULL);
