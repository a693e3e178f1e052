"""A TF task as a user's own launcher starts it: TF_CONFIG and `tf.distribute.Server` with the
protocol TF_CONFIG's rpc_layer names. It never imports rdmadev: with rdmadev installed, the
grpc+rdmadev protocol comes from its plugin in site-packages/tensorflow-plugins/."""
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                              task_index=resolver.task_id, protocol=resolver.rpc_layer, start=True)
print("READY", server.target, flush=True)
server.join()
