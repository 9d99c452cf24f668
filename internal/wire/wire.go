// Package wire names the headers of delaybridge's envelope: what broker
// encodes and decodes and what the adapters and their tests need to carry
// or forge them. Users never see these names; they see broker.Message.
package wire

// Envelope header names. RocketMQ carries them as user properties; RabbitMQ
// packs them into one AMQP header (see package rabbit).
const (
	HeaderVersion    = "delaybridge-v"
	HeaderTaskID     = "delaybridge-task"
	HeaderTopic      = "delaybridge-topic"
	HeaderKey        = "delaybridge-key"
	HeaderDeliverAt  = "delaybridge-deliver-at"
	HeaderHop        = "delaybridge-hop"
	HeaderAttempt    = "delaybridge-attempt"
	HeaderGeneration = "delaybridge-gen"
	HeaderTrace      = "delaybridge-trace"
	// HeaderPrefix starts every envelope header; free headers follow
	// HeaderFreePrefix so they can never collide with the envelope's own.
	HeaderPrefix     = "delaybridge-"
	HeaderFreePrefix = "delaybridge-h-"
	// EnvelopeVersion is the only envelope version this code writes and reads.
	EnvelopeVersion = "1"
)
