// Sends gpu.ofu gauges and job.mfu through the OpenTelemetry JS SDK's OTLP/gRPC exporter, then exits.
//
//   node send_ofu.js http://127.0.0.1:PORT
//
// Two layouts, as the collector must accept both: one MeterProvider whose Resource is one GPU (the
// producer's layout), and one application-style MeterProvider putting hw.id / job.id on data points.
'use strict';

const { MeterProvider, PeriodicExportingMetricReader } = require('@opentelemetry/sdk-metrics');
const { OTLPMetricExporter } = require('@opentelemetry/exporter-metrics-otlp-grpc');
const { resourceFromAttributes } = require('@opentelemetry/resources');

const endpoint = process.argv[2];
if (!endpoint) {
  console.error('usage: node send_ofu.js http://HOST:PORT');
  process.exit(2);
}

function provider(attributes) {
  const exporter = new OTLPMetricExporter({ url: endpoint });
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3600000 });
  return new MeterProvider({ resource: resourceFromAttributes(attributes), readers: [reader] });
}

async function main() {
  const perGpu = provider({
    'service.name': 'otel-ofu',
    'host.name': 'node-js-host',
    'hw.id': 'GPU-js-0',
    'hw.model': 'NVIDIA H100 80GB HBM3',
    'gpu.index': 0,
    'gpu.precision': 'bf16',
    'job.id': 'js-job',
  });
  perGpu.getMeter('otel_ofu').createGauge('gpu.ofu', { unit: '1' }).record(0.6);

  const app = provider({ 'service.name': 'js-trainer', 'host.name': 'node-js-host' });
  const meter = app.getMeter('trainer');
  const ofu = meter.createGauge('gpu.ofu', { unit: '1' });
  ofu.record(0.4, { 'hw.id': 'GPU-js-1', 'hw.model': 'NVIDIA H100 80GB HBM3', 'gpu.precision': 'bf16', 'job.id': 'js-job' });
  ofu.record(0.2, { 'hw.id': 'GPU-js-2', 'hw.model': 'NVIDIA H100 80GB HBM3', 'gpu.precision': 'bf16', 'job.id': 'js-job' });
  ofu.record(1.7, { 'hw.id': 'GPU-js-3', 'job.id': 'js-job' }); // out of range: rejected, counted
  meter.createGauge('job.mfu', { unit: '1' }).record(0.38, { 'job.id': 'js-job' });
  meter.createCounter('js.requests').add(5, { route: '/train' }); // not ours: passes through

  // shutdown() collects and exports once more; a forceFlush() before it would send every gauge twice.
  for (const p of [perGpu, app]) {
    await p.shutdown();
  }
  console.log('sent');
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
