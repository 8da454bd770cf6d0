"""The ground every other package stands on: errors that carry a located problem (`errors`), where
state and caches live (`paths`), atomic file writes and log tails (`files`), file locks (`locking`),
progress output (`progress`), the machine's conditions during a measurement (`conditions`), and the
typed records handed from one layer to the next (`records`: the cluster record `cluster.json`, the
test results `results.json`). Imports nothing else of harness."""
