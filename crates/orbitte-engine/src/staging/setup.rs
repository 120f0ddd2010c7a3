//! Why the cuda-staging lanes of a device could not be made.

use orbitte_cuda::PipelineError;
use orbitte_memory::MemoryError;

use crate::error::RegisterError;

/// Why the cuda-staging lanes of a device could not be made. Nothing of
/// them is left registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingSetupError {
    /// Depth or chunk size zero.
    #[error(
        "cuda-staging needs at least one pipeline and a chunk of at least one byte (asked depth \
         {depth}, chunk {chunk}); the default chunk is 4 MiB"
    )]
    Zero {
        /// Pipelines asked for.
        depth: usize,
        /// Chunk size asked for.
        chunk: usize,
    },
    /// A staging pipeline (streams, pinned bounce buffers) could not be made.
    #[error("cuda-staging pipeline {lane} on CUDA device {device}: {source}")]
    Pipeline {
        /// Pipeline index.
        lane: usize,
        /// CUDA device index.
        device: usize,
        /// Why.
        #[source]
        source: PipelineError,
    },
    /// The engine's view of a pinned bounce buffer
    /// (`HostMemory::from_dma_buffer`) could not be made.
    #[error("host view of bounce buffer {slot} of cuda-staging pipeline {lane}: {source}")]
    View {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// Registering a bounce buffer with the engine failed. A registration
    /// error never switches silently to another path.
    #[error(
        "registering bounce buffer {slot} of cuda-staging pipeline {lane} ({bytes} bytes) with \
         the engine failed: {source}"
    )]
    Register {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Its size.
        bytes: usize,
        /// The engine's error.
        #[source]
        source: RegisterError,
    },
    /// A lane's thread could not be started.
    #[error("starting the thread of cuda-staging lane {lane}: {source}")]
    Thread {
        /// Lane index.
        lane: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
