"""``spark.read.format("vipc")``: the frame index of recordings as a PySpark Python
data source (PySpark 4+), one partition per segment.

    spark.read.format("vipc").load("rec1")                     # a path, a glob, a folder
    spark.read.format("vipc").option("paths", "rec1,rec2").load()

Same rows as ``read.read_index`` (which uses Spark's native Parquet reader and is
~3x faster on big indexes); this one needs no file listing on the JVM side and
reads each segment with pyarrow in the executors. The reader holds only strings:
no open file or lock travels to the executors.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from visionipc.apps.pipeline.read import INDEX_ARROW_SCHEMA, INDEX_SPARK_SCHEMA, find_recordings, index_files

SCHEMA = INDEX_SPARK_SCHEMA + ", recording_id string, recording_path string"


class SegmentPartition(InputPartition):
    def __init__(self, recording_id: str, recording_path: str, index_file: str):
        super().__init__(index_file)
        self.recording_id, self.recording_path, self.index_file = recording_id, recording_path, index_file


class VipcReader(DataSourceReader):
    def __init__(self, paths: list, skip_empty: bool):
        self.paths, self.skip_empty = paths, skip_empty

    def partitions(self):
        files = index_files(find_recordings(self.paths), skip_empty=self.skip_empty)
        return [SegmentPartition(rec.recording_id, rec.path, path) for rec, _, _, path in files]

    def read(self, partition):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(partition.index_file, schema=INDEX_ARROW_SCHEMA)
        n = len(table)
        table = table.append_column("recording_id", pa.array([partition.recording_id] * n, pa.string())).append_column(
            "recording_path", pa.array([partition.recording_path] * n, pa.string())
        )
        yield from table.to_batches()


class VipcDataSource(DataSource):
    """Options: ``path`` (from ``load``) and/or ``paths`` (comma-separated), ``skip_empty``."""

    @classmethod
    def name(cls):
        return "vipc"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        paths = [p for key in ("path", "paths") for p in self.options.get(key, "").split(",") if p]
        if not paths:
            raise ValueError('spark.read.format("vipc") needs a recording: .load(PATH) or .option("paths", "a,b")')
        return VipcReader(paths, str(self.options.get("skip_empty", "false")).lower() == "true")


def register(spark) -> None:
    spark.dataSource.register(VipcDataSource)
