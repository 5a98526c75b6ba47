// OpenTelemetry JS SDK setup for the Express shop (loaded first: node --require ./tracing.js app.js).
// Spans go over OTLP/HTTP (protobuf) to SHOP_OTLP; the batch processor flushes every 200 ms and the
// process flushes and shuts the provider down on SIGTERM, so no span is lost at the end.
// With SHOP_ZIPKIN set, the same spans also go through the SDK's Zipkin exporter (JSON v2) to that
// URL, as a Zipkin user's app sends them.
// Semantic conventions: set OTEL_SEMCONV_STABILITY_OPT_IN=database,http for the newer ones.
'use strict';
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { ZipkinExporter } = require('@opentelemetry/exporter-zipkin');
const { registerInstrumentations } = require('@opentelemetry/instrumentation');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');
const { ExpressInstrumentation } = require('@opentelemetry/instrumentation-express');
const { PgInstrumentation } = require('@opentelemetry/instrumentation-pg');

const batching = { scheduledDelayMillis: 200, maxExportBatchSize: 512, maxQueueSize: 65536 };
const exporters = [new OTLPTraceExporter({ url: process.env.SHOP_OTLP })];
if (process.env.SHOP_ZIPKIN) exporters.push(new ZipkinExporter({ url: process.env.SHOP_ZIPKIN }));
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': process.env.OTEL_SERVICE_NAME || 'shop-express' }),
  spanProcessors: exporters.map((e) => new BatchSpanProcessor(e, batching)),
});
provider.register();
registerInstrumentations({
  instrumentations: [new HttpInstrumentation(), new ExpressInstrumentation(), new PgInstrumentation()],
});
global.__shopTracerProvider = provider;
