"""The options Spark's built-in sources read, so that a misspelt ``source.option.<name>`` stops
``validate`` with a did-you-mean instead of being ignored by Spark (which drops an option it
does not know without a word).

The names are Spark's own (4.x): the file sources' streaming options (``FileStreamOptions``),
their listing options (``FileIndexOptions``, ``FileSourceOptions``) and each format's reader
options (``CSVOptions``, ``JSONOptions``, ``XmlOptions``, ``ParquetOptions``, ``OrcOptions``,
``TextOptions``, spark-avro's ``AvroOptions``); Kafka's ``KafkaSourceProvider``; the rate
sources'. ``tests/test_source_options.py`` compares the lists with the ones Spark's classes
give. Spark compares option names without case, and so does this check. A file source also
hands every option to the Hadoop configuration of its read, so a dotted name there
(``fs.s3a.endpoint``, ``parquet.enable.dictionary``) passes, as do Kafka's ``kafka.<consumer
property>``; a data source named by its class passes unchecked.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from dedupsink.cli.config import SOURCE_OPTION, JobConfig
from dedupsink.errors import ConfigError

__all__ = ["SOURCE_OPTIONS", "check_source_options", "known_options"]


def _names(text: str) -> tuple[str, ...]:
    """Option names written as words, as Spark's option classes list them."""
    return tuple(text.split())


# Every file source, streaming: FileStreamOptions; listing: FileIndexOptions, FileSourceOptions.
FILE_STREAM_OPTIONS = (
    "maxFilesPerTrigger",
    "maxBytesPerTrigger",
    "maxFileAge",
    "latestFirst",
    "fileNameOnly",
    "maxCachedFiles",
    "discardCachedInputRatio",
    "cleanSource",
    "sourceArchiveDir",
)
FILE_INDEX_OPTIONS = (
    "basePath",
    "ignoreInvalidPartitionPaths",
    "ignoreMissingFiles",
    "ignoredPathSegmentRegex",
    "modifiedAfter",
    "modifiedBefore",
    "pathGlobFilter",
    "recursiveFileLookup",
    "timeZone",
    "ignoreCorruptFiles",
)
# Each format's reader (and writer: Spark's lists hold both) options.
FORMAT_OPTIONS: dict[str, tuple[str, ...]] = {
    "csv": _names(
        """
        charToEscapeQuoteEscaping charset codec columnNameOfCorruptRecord columnPruning
        comment compression dateFormat delimiter emptyValue enableDateTimeParsingFallback
        encoding enforceSchema escape escapeQuotes extension header ignoreLeadingWhiteSpace
        ignoreTrailingWhiteSpace inferSchema inputBufferSize lineSep locale
        maxCharsPerColumn maxColumns mode multiLine nanValue negativeInf nullValue
        positiveInf preferDate quote quoteAll samplingRatio sep singleVariantColumn
        timeFormat timeZone timestampFormat timestampNTZFormat unescapedQuoteHandling
        """
    ),
    "json": _names(
        """
        allowBackslashEscapingAnyCharacter allowComments allowNonNumericNumbers
        allowNumericLeadingZeros allowSingleQuotes allowUnquotedControlChars
        allowUnquotedFieldNames charset columnNameOfCorruptRecord compression dateFormat
        dropFieldIfAllNull enableDateTimeParsingFallback encoding explodeEmbeddedArray
        ignoreNullFields inferTimestamp lineSep locale mode multiLine prefersDecimal pretty
        primitivesAsString samplingRatio singleVariantColumn sortKeys timeFormat timeZone
        timestampFormat timestampNTZFormat useUnsafeRow writeNonAsciiCharacterAsCodePoint
        """
    ),
    "xml": _names(
        """
        arrayElementName attributePrefix charset columnNameOfCorruptRecord compression
        dateFormat declaration encoding excludeAttribute ignoreNamespace
        ignoreSurroundingSpaces indent inferSchema locale mode multiLine nullValue
        preferDate prefersDecimal rootTag rowTag rowValidationXSDPath samplingRatio
        singleVariantColumn timeFormat timeZone timestampFormat timestampNTZFormat
        useLegacyXMLParser validateName valueTag wildcardColName
        """
    ),
    "parquet": ("compression", "datetimeRebaseMode", "int96RebaseMode", "mergeSchema"),
    "orc": ("compression", "mergeSchema"),
    "text": ("compression", "encoding", "lineSep", "wholetext"),
    # spark-avro is a package of its own, not in PySpark's jars: its names from its sources.
    "avro": _names(
        """
        avroSchema avroSchemaUrl compression datetimeRebaseMode
        enableStableIdentifiersForUnionType ignoreExtension mode positionalFieldMatching
        recordName recordNamespace recursiveFieldMaxDepth stableIdentifierPrefixForUnionType
        """
    ),
}
KAFKA_OPTIONS = _names(
    """
    assign subscribe subscribePattern startingOffsets endingOffsets
    startingOffsetsByTimestamp endingOffsetsByTimestamp startingTimestamp
    endingTimestamp startingOffsetsByTimestampStrategy failOnDataLoss minPartitions
    maxRecordsPerPartition maxOffsetsPerTrigger minOffsetsPerTrigger maxTriggerDelay
    fetchOffset.numRetries fetchOffset.retryIntervalMs kafkaConsumer.pollTimeoutMs
    groupIdPrefix includeHeaders
    """
)
RATE_OPTIONS = ("rowsPerSecond", "rampUpTime", "numPartitions")
RATE_MICRO_BATCH_OPTIONS = _names("rowsPerBatch numPartitions startTimestamp advanceMillisPerBatch")

# The options each source the CLI knows reads.
SOURCE_OPTIONS: dict[str, tuple[str, ...]] = {
    **{
        name: (*FILE_STREAM_OPTIONS, *FILE_INDEX_OPTIONS, *options)
        for name, options in FORMAT_OPTIONS.items()
    },
    "kafka": KAFKA_OPTIONS,
    "rate": RATE_OPTIONS,
    "rate-micro-batch": RATE_MICRO_BATCH_OPTIONS,
}
KAFKA_CLIENT_PREFIX = "kafka."


def known_options(source_format: str) -> tuple[str, ...] | None:
    """The options a source reads; None for a source named by its class (unchecked)."""
    return SOURCE_OPTIONS.get(source_format)


def check_source_options(config: JobConfig, source_format: str) -> None:
    """Refuse a ``source.option.<name>`` the source does not read, naming it, where it was set
    and the option it most likely meant."""
    known = known_options(source_format)
    if known is None:
        return
    by_lower = {name.lower(): name for name in known}
    for name in config.source_options:
        if name.lower() in by_lower or _passes_through(source_format, name):
            continue
        key = SOURCE_OPTION + name
        raise ConfigError(
            key,
            f"{key} is not an option of Spark's {source_format} source"
            f"{_hint(source_format, name, by_lower)}",
            config.where(key),
        )


def _passes_through(source_format: str, name: str) -> bool:
    if source_format == "kafka":
        return name.lower().startswith(KAFKA_CLIENT_PREFIX) and len(name) > len(KAFKA_CLIENT_PREFIX)
    # A file source gives its options to the read's Hadoop configuration, whose keys are dotted.
    return source_format in FORMAT_OPTIONS and "." in name.strip(".")


def _hint(source_format: str, name: str, by_lower: Mapping[str, str]) -> str:
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    if close:
        return f" (did you mean {SOURCE_OPTION}{by_lower[close[0]]}?)"
    if source_format in FORMAT_OPTIONS:  # some sixty names: say where they are
        return (
            f" (it reads the file sources' options and the {source_format} reader's, as Spark's "
            "data source options page lists them; a Hadoop setting for the read is a dotted name)"
        )
    listed = ", ".join(sorted(by_lower.values(), key=str.lower))
    more = ", kafka.<consumer property>" if source_format == "kafka" else ""
    return f" (it reads {listed}{more})"
