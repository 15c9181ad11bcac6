-- Migration 4 on PostgreSQL: ../0004_server_gpus.sql with a 64-bit time.
CREATE TABLE server_gpus (server TEXT COLLATE "C" PRIMARY KEY, gpus TEXT NOT NULL, reported BIGINT NOT NULL);
