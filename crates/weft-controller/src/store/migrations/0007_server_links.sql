-- Migration 5: each agent's RoCE ports and NICs from its last report (model::HostLinks as
-- JSON), for `weft nodes` and the console's overview.
CREATE TABLE server_links (server TEXT PRIMARY KEY, links TEXT NOT NULL, reported INTEGER NOT NULL);
