package bridge

const (
	// TailBytesDefault bounds each stream's tail cache: the newest committed messages, kept
	// so that consumers that keep up are served from memory and never touch PostgreSQL.
	TailBytesDefault = 16 << 20
	// TailTotalBytesDefault bounds all tail caches together: every stream that takes
	// publishes has one, whether or not it has consumers yet.
	TailTotalBytesDefault = 256 << 20
)
