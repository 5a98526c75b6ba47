// OpenTelemetry JS SDK setup for the Express shop (loaded first: node --require ./tracing.js app.js).
// Spans go over OTLP/HTTP (protobuf) to SHOP_OTLP; the batch processor flushes every 200 ms and the
// process flushes and shuts the provider down on SIGTERM, so no span is lost at the end.
// Semantic conventions: set OTEL_SEMCONV_STABILITY_OPT_IN=database,http for the newer ones.
'use strict';
const { NodeTracerProvider } = require('@opentelemetry/sdk-trace-node');
const { BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { registerInstrumentations } = require('@opentelemetry/instrumentation');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');
const { ExpressInstrumentation } = require('@opentelemetry/instrumentation-express');
const { PgInstrumentation } = require('@opentelemetry/instrumentation-pg');

const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': process.env.OTEL_SERVICE_NAME || 'shop-express' }),
  spanProcessors: [
    new BatchSpanProcessor(new OTLPTraceExporter({ url: process.env.SHOP_OTLP }), {
      scheduledDelayMillis: 200,
      maxExportBatchSize: 512,
      maxQueueSize: 65536,
    }),
  ],
});
provider.register();
registerInstrumentations({
  instrumentations: [new HttpInstrumentation(), new ExpressInstrumentation(), new PgInstrumentation()],
});
global.__shopTracerProvider = provider;
