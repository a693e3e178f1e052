"""AlexNet, VGG16, GoogLeNet (Inception v1), Inception v3, ResNet-50/152 in the shapes
tf_cnn_benchmarks uses (ImageNet: 1000 classes), with SAME padding so any image size >= 32
works. Each is ``forward(p, images) -> logits`` over a ``layers.Params`` store."""
from .layers import avg_pool, conv, dense, flatten, global_pool, max_pool

__all__ = ["MODELS"]
CLASSES = 1000


def alexnet(p, x):
    x = max_pool(p, conv(p, x, 64, 11, stride=4))
    x = max_pool(p, conv(p, x, 192, 5))
    x = conv(p, conv(p, conv(p, x, 384, 3), 384, 3), 256, 3)
    x = flatten(p, max_pool(p, x))
    return dense(p, dense(p, dense(p, x, 4096), 4096), CLASSES, relu=False)


def vgg16(p, x):
    for reps, filters in ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512)):
        for _ in range(reps):
            x = conv(p, x, filters, 3)
        x = max_pool(p, x, 2, 2)
    x = flatten(p, x)
    return dense(p, dense(p, dense(p, x, 4096), 4096), CLASSES, relu=False)


def _inception_v1(p, x, c1, r3, c3, r5, c5, pp):
    tf = p.tf
    b1 = conv(p, x, c1, 1)
    b2 = conv(p, conv(p, x, r3, 1), c3, 3)
    b3 = conv(p, conv(p, x, r5, 1), c5, 5)
    b4 = conv(p, max_pool(p, x, 3, 1), pp, 1)
    return tf.concat([b1, b2, b3, b4], -1)


def googlenet(p, x):
    x = max_pool(p, conv(p, x, 64, 7, stride=2))
    x = max_pool(p, conv(p, conv(p, x, 64, 1), 192, 3))
    x = _inception_v1(p, x, 64, 96, 128, 16, 32, 32)
    x = max_pool(p, _inception_v1(p, x, 128, 128, 192, 32, 96, 64))
    for cfg in ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
                (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)):
        x = _inception_v1(p, x, *cfg)
    x = max_pool(p, x)
    x = _inception_v1(p, x, 256, 160, 320, 32, 128, 128)
    x = _inception_v1(p, x, 384, 192, 384, 48, 128, 128)
    return dense(p, global_pool(p, x), CLASSES, relu=False)


def inception3(p, x):
    tf = p.tf

    def c(x, f, kh, kw=None, stride=1):
        return conv(p, x, f, kh, kw, stride, bn=True)

    x = c(c(c(x, 32, 3, stride=2), 32, 3), 64, 3)
    x = max_pool(p, x)
    x = max_pool(p, c(c(x, 80, 1), 192, 3))
    for pp in (32, 64, 64):  # mixed 35x35
        x = tf.concat([c(x, 64, 1), c(c(x, 48, 1), 64, 5), c(c(c(x, 64, 1), 96, 3), 96, 3),
                       c(avg_pool(p, x), pp, 1)], -1)
    x = tf.concat([c(x, 384, 3, stride=2), c(c(c(x, 64, 1), 96, 3), 96, 3, stride=2),
                   max_pool(p, x)], -1)
    for c7 in (128, 160, 160, 192):  # mixed 17x17
        b2 = c(c(c(x, c7, 1), c7, 1, 7), 192, 7, 1)
        b3 = c(c(c(c(c(x, c7, 1), c7, 7, 1), c7, 1, 7), c7, 7, 1), 192, 1, 7)
        x = tf.concat([c(x, 192, 1), b2, b3, c(avg_pool(p, x), 192, 1)], -1)
    x = tf.concat([c(c(x, 192, 1), 320, 3, stride=2),
                   c(c(c(c(x, 192, 1), 192, 1, 7), 192, 7, 1), 192, 3, stride=2), max_pool(p, x)], -1)
    for _ in range(2):  # mixed 8x8
        b2 = c(x, 384, 1)
        b3 = c(c(x, 448, 1), 384, 3)
        x = tf.concat([c(x, 320, 1), c(b2, 384, 1, 3), c(b2, 384, 3, 1), c(b3, 384, 1, 3),
                       c(b3, 384, 3, 1), c(avg_pool(p, x), 192, 1)], -1)
    return dense(p, global_pool(p, x), CLASSES, relu=False)


def _resnet(blocks):
    def forward(p, x):
        tf = p.tf
        x = max_pool(p, conv(p, x, 64, 7, stride=2, bn=True))
        for stage, (n, depth) in enumerate(zip(blocks, (64, 128, 256, 512))):
            for i in range(n):
                stride = 2 if i == 0 and stage > 0 else 1
                if i == 0:
                    shortcut = conv(p, x, 4 * depth, 1, stride=stride, bn=True, relu=False)
                else:
                    shortcut = x
                y = conv(p, x, depth, 1, bn=True)
                y = conv(p, y, depth, 3, stride=stride, bn=True)  # v1.5: stride on the 3x3
                y = conv(p, y, 4 * depth, 1, bn=True, relu=False)
                x = tf.nn.relu(y + shortcut)
        return dense(p, global_pool(p, x), CLASSES, relu=False)
    return forward


MODELS = {
    "alexnet": alexnet,
    "vgg16": vgg16,
    "googlenet": googlenet,
    "inception3": inception3,
    "resnet50": _resnet([3, 4, 6, 3]),
    "resnet152": _resnet([3, 8, 36, 3]),
}
