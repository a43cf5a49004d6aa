# cuDNN's own recording of a built plan into a CUDA graph the caller owns (populate_cuda_graph /
# update_cuda_graph, cudnn_graph._cuda_graphs). Python-level only: it declares nothing to share.
