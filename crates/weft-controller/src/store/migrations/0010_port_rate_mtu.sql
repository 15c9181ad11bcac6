-- Migration 10: each port's rate as sysfs writes it (`400 Gb/sec (4X NDR)`) and the MTU
-- of its netdev (IPoIB or RoCE), from the agent's last report, for `weft nodes` and the
-- console's overview. NULL: not reported (an agent older than this, or no such file).
ALTER TABLE ports ADD COLUMN rate TEXT;
ALTER TABLE ports ADD COLUMN mtu INTEGER;
