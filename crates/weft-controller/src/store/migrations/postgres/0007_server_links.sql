-- Migration 7 on PostgreSQL: ../0007_server_links.sql with a 64-bit time.
CREATE TABLE server_links (server TEXT COLLATE "C" PRIMARY KEY, links TEXT NOT NULL, reported BIGINT NOT NULL);
