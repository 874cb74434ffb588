"""The worker (`reflect worker`): the Faust app and the runtime it holds, the
pipeline, partition ownership and handover, commits and read order, the Faust
patches, rebuild, compaction, the replay lab's side workers, the watches, its
metrics and its log output."""
